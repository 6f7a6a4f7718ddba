//! Which file format a plot is written in, from its name.

use std::path::Path;

use crate::PlotError;

/// The formats [`write`](crate::write) produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics: small, sharp at any zoom, text stays text.
    Svg,
    /// A bitmap, for viewers and documents that take no SVG.
    Png,
    /// The figure's data ([`Figure::to_json`](crate::Figure::to_json)), to draw later,
    /// alone or merged with other runs.
    Json,
}

impl Format {
    /// The format named by `path`'s extension (`.svg`, `.png`, `.json`, in any case).
    ///
    /// # Errors
    ///
    /// [`PlotError::UnknownFormat`] for any other name.
    pub fn of(path: &Path) -> Result<Self, PlotError> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("svg") => Ok(Self::Svg),
            Some("png") => Ok(Self::Png),
            Some("json") => Ok(Self::Json),
            _ => Err(PlotError::UnknownFormat {
                path: path.to_path_buf(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_from_extension() {
        assert_eq!(Format::of(Path::new("a/b.svg")).unwrap(), Format::Svg);
        assert_eq!(Format::of(Path::new("B.PNG")).unwrap(), Format::Png);
        assert_eq!(Format::of(Path::new("x.json")).unwrap(), Format::Json);
        for bad in ["plot", "plot.jpg", "svg", ".svg.txt"] {
            let e = Format::of(Path::new(bad)).unwrap_err();
            assert!(e.to_string().contains(".svg, .png or .json"), "{bad}: {e}");
        }
    }
}
