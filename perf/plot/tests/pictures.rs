//! The files `write` makes, read back: a PNG decodes to the figure's size and has ink where
//! the series are, an SVG is a complete document, and the JSON form draws the same picture.

use std::path::{Path, PathBuf};

use dp_plot::{Figure, PercentileSeries, PlotError, SweepPoint, SweepSeries, render, write};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dp-plot-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn figure() -> Figure {
    let mut f = Figure::new("a figure");
    f.percentiles
        .push(PercentileSeries::from_samples("fast", (0..10_000).map(|i| 800 + i % 300)).unwrap());
    f.percentiles.push(
        PercentileSeries::from_samples("slow", (0..10_000).map(|i| 5_000 + i * i % 90_000))
            .unwrap(),
    );
    f.sweep.push(SweepSeries {
        label: "bw".into(),
        points: (6..=20)
            .map(|k| SweepPoint {
                bytes: 1 << k,
                gbps: Some(f64::from(k)),
                lat_ns: None,
            })
            .collect(),
    });
    f
}

/// (width, height, RGBA pixels) of a PNG.
fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
    let d = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut r = d.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    let px = match info.color_type {
        png::ColorType::Rgb => buf
            .chunks(3)
            .flat_map(|c| [c[0], c[1], c[2], 255])
            .collect(),
        png::ColorType::Rgba => buf,
        other => panic!("unexpected PNG colour type {other:?}"),
    };
    (info.width, info.height, px)
}

#[test]
fn png_has_the_size_and_ink_of_its_panels() {
    let path = tmp("f.png");
    write(&figure(), &path).unwrap();
    let (w, h, px) = decode(&path);
    assert_eq!(
        (w, h),
        (2 * 640, 460),
        "two panels: distribution and bandwidth"
    );
    // Each half of the picture (one panel each) has series colours in it, not only the
    // white background, grey grid and black text: the Tableau blue and orange of the first
    // two series.
    for half in 0..2 {
        let mut blue = 0;
        let mut orange = 0;
        for y in 0..h {
            for x in half * w / 2..(half + 1) * w / 2 {
                let i = ((y * w + x) * 4) as usize;
                match (px[i], px[i + 1], px[i + 2]) {
                    (31, 119, 180) => blue += 1,
                    (255, 127, 14) => orange += 1,
                    _ => {}
                }
            }
        }
        assert!(blue > 200, "panel {half}: {blue} blue pixels");
        if half == 0 {
            assert!(orange > 200, "panel {half}: {orange} orange pixels");
        }
    }
    // Text is drawn (the compiled-in font): the caption row has dark pixels in its middle.
    let dark = (0..30)
        .flat_map(|y| (w / 2 - 150..w / 2 + 150).map(move |x| (y * w + x) as usize * 4))
        .filter(|&i| px[i] < 100 && px[i + 1] < 100 && px[i + 2] < 100)
        .count();
    assert!(dark > 50, "caption: {dark} dark pixels");
}

#[test]
fn svg_and_json_files() {
    let f = figure();
    let svg = tmp("f.svg");
    write(&f, &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert_eq!(text, render(&f).unwrap());
    let json = tmp("f.json");
    write(&f, &json).unwrap();
    let back = Figure::read(&json).unwrap();
    assert_eq!(back, f, "bit for bit");
    assert_eq!(render(&back).unwrap(), text);
}

#[test]
fn bad_names_and_empty_figures_say_what_to_do() {
    let e = write(&figure(), &tmp("f.gif")).unwrap_err();
    assert!(matches!(e, PlotError::UnknownFormat { .. }));
    assert!(
        e.to_string().contains("end it in .svg, .png or .json"),
        "{e}"
    );
    let e = write(&Figure::new("nothing"), &tmp("e.png")).unwrap_err();
    assert!(
        e.to_string().contains("nothing to plot in \"nothing\""),
        "{e}"
    );
    let e = write(&figure(), Path::new("/nonexistent-dir/f.svg")).unwrap_err();
    assert!(matches!(e, PlotError::Io { .. }), "{e}");
}
