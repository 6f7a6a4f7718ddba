//! The perf report as a person sees it: `scripts/perf-report` writes `OUTDIR/index.html`;
//! this test opens it in a real headless browser (Debian's Chromium), takes a screenshot
//! of the whole page, and checks that every plot the report wrote is on the page, decoded by
//! the browser, and drawn where the page lays it out (its region of the screenshot has
//! the ink of a chart, not a blank box).
//!
//! It is the negative control that makes the pixel check mean something: the same page with
//! every plot hidden (laid out the same, drawn as nothing) must fail the same check, region
//! by region.
//!
//! Heavy (a report and a browser), so not part of `cargo test`; run it with
//!
//! ```text
//! scripts/perf-report --quick target/report
//! scripts/check-report-render target/report      # needs: apt-get install chromium
//! ```
//!
//! which runs this test with `DP_REPORT_DIR` set and `--ignored`. It leaves
//! `OUTDIR/screenshot.png` (the page) and `OUTDIR/screenshot-hidden.png` (the control).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The browser's window width; the page is laid out for it, and the probe and the
/// screenshots use the same one so that both see the same layout.
const WIDTH: u32 = 1400;

/// Finds the layout of every plot after load and puts it on `<body data-probe=...>`, where
/// `--dump-dom` shows it.
const PROBE: &str = r#"<script>
window.addEventListener('load', () => {
  const plots = [...document.querySelectorAll('figure.plot img')].map(img => {
    const r = img.getBoundingClientRect();
    return { src: img.getAttribute('src'), complete: img.complete, w: img.naturalWidth,
             x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height };
  });
  document.body.setAttribute('data-probe', JSON.stringify(
    { height: document.documentElement.scrollHeight, plots }));
});
</script>"#;

fn chromium() -> PathBuf {
    for c in ["chromium", "chromium-browser"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .output()
        {
            let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if !p.is_empty() {
                return PathBuf::from(p);
            }
        }
    }
    panic!("chromium not found: apt-get install chromium (Debian's package)");
}

/// Chromium headless with the flags that work on this machine's closed network.
fn browser(dir: &Path, args: &[String]) -> std::process::Output {
    let profile = dir.join(".chromium-profile");
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("run chromium");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[derive(Debug)]
struct Placed {
    src: String,
    x: u32,
    y: u32,
    w: u32,
    h: u32,
}

/// The page's height and its plots, as the browser laid them out.
fn probe(dir: &Path, page: &str) -> (u32, Vec<Placed>) {
    let path = dir.join(".render-probe.html");
    std::fs::write(&path, page.replace("</body>", &format!("{PROBE}</body>"))).unwrap();
    let out = browser(
        dir,
        &[
            format!("--window-size={WIDTH},1000"),
            "--dump-dom".into(),
            url(&path),
        ],
    );
    let _ = std::fs::remove_file(&path);
    let dom = String::from_utf8_lossy(&out.stdout);
    let start = dom.find("data-probe=\"").expect("the probe ran") + "data-probe=\"".len();
    let end = start + dom[start..].find('"').unwrap();
    let json = dom[start..end]
        .replace("&quot;", "\"")
        .replace("&amp;", "&");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let n = |x: &serde_json::Value| x.as_f64().unwrap().round() as u32;
    let plots = v["plots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["complete"], true, "the browser did not load {p}");
            assert!(n(&p["w"]) > 0, "the browser could not decode {p}");
            Placed {
                src: p["src"].as_str().unwrap().to_owned(),
                x: n(&p["x"]),
                y: n(&p["y"]),
                w: n(&p["width"]),
                h: n(&p["height"]),
            }
        })
        .collect();
    (n(&v["height"]), plots)
}

fn url(p: &Path) -> String {
    format!("file://{}", p.canonicalize().unwrap().display())
}

/// A screenshot of `page` (written next to the report, so relative links work) as
/// (width, height, RGBA).
fn screenshot(dir: &Path, page: &str, height: u32, keep: &str) -> (u32, u32, Vec<u8>) {
    let path = dir.join(".render-shot.html");
    std::fs::write(&path, page).unwrap();
    let png = dir.join(keep);
    browser(
        dir,
        &[
            format!("--window-size={WIDTH},{height}"),
            format!("--screenshot={}", png.display()),
            url(&path),
        ],
    );
    let _ = std::fs::remove_file(&path);
    let d = png::Decoder::new(std::fs::File::open(&png).unwrap());
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
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    (info.width, info.height, px)
}

/// Whether a region of the screenshot shows a chart: enough ink (pixels that are not
/// near-white) and colour (series lines are coloured, text and axes are grey or black).
fn shows_a_chart(shot: &(u32, u32, Vec<u8>), p: &Placed) -> Result<(), String> {
    let (w, h, px) = shot;
    let (x1, y1) = ((p.x + p.w).min(*w), (p.y + p.h).min(*h));
    if p.x + 50 > x1 || p.y + 50 > y1 {
        return Err(format!("{} is outside the screenshot", p.src));
    }
    let (mut ink, mut colour, mut all) = (0u64, 0u64, 0u64);
    for y in p.y..y1 {
        for x in p.x..x1 {
            let i = ((y * w + x) * 4) as usize;
            let (r, g, b) = (i32::from(px[i]), i32::from(px[i + 1]), i32::from(px[i + 2]));
            all += 1;
            if r.min(g).min(b) < 200 {
                ink += 1;
            }
            if (r - g).abs().max((g - b).abs()).max((r - b).abs()) > 60 {
                colour += 1;
            }
        }
    }
    let (ink_pct, colour_pct) = (
        100.0 * ink as f64 / all as f64,
        100.0 * colour as f64 / all as f64,
    );
    if ink_pct < 1.0 || colour_pct < 0.1 {
        return Err(format!(
            "{} at ({}, {}) {}x{}: {ink_pct:.2} % ink, {colour_pct:.3} % colour",
            p.src, p.x, p.y, p.w, p.h
        ));
    }
    Ok(())
}

#[test]
#[ignore = "needs a report and chromium: scripts/check-report-render OUTDIR"]
fn report_renders_with_every_plot() {
    let dir = PathBuf::from(
        std::env::var("DP_REPORT_DIR")
            .expect("DP_REPORT_DIR names the report directory (scripts/check-report-render)"),
    );
    let page = std::fs::read_to_string(dir.join("index.html")).expect("OUTDIR/index.html");

    // Every plot the report wrote is on the page.
    let mut written: Vec<String> = std::fs::read_dir(dir.join("plots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".svg"))
        .map(|n| format!("plots/{n}"))
        .collect();
    written.sort();
    let (height, plots) = probe(&dir, &page);
    let mut shown: Vec<String> = plots.iter().map(|p| p.src.clone()).collect();
    shown.sort();
    assert!(!written.is_empty(), "the report wrote no plot");
    assert_eq!(shown, written, "plots on the page vs plots written");

    // Each is drawn where it is laid out.
    let shot = screenshot(&dir, &page, height, "screenshot.png");
    assert_eq!(shot.0, WIDTH);
    let failures: Vec<String> = plots
        .iter()
        .filter_map(|p| shows_a_chart(&shot, p).err())
        .collect();
    assert!(failures.is_empty(), "plots not drawn: {failures:#?}");

    // The control: the same layout with the plots hidden must fail, every one of them.
    let hidden = page.replace("<img src=", "<img style=\"visibility:hidden\" src=");
    let blank = screenshot(&dir, &hidden, height, "screenshot-hidden.png");
    for p in &plots {
        assert!(
            shows_a_chart(&blank, p).is_err(),
            "the check passes for a hidden plot ({}): it cannot tell a plot from a blank",
            p.src
        );
    }
    println!(
        "{} plots rendered; page {}x{} px in {}",
        plots.len(),
        shot.0,
        shot.1,
        dir.join("screenshot.png").display()
    );
}
