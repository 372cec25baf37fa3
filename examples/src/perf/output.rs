//! Files a run writes (`--output`, `--plot`), checked before the run.
//!
//! A path that cannot be written used to be found only at the end, after
//! the whole run, and the report was lost with it. Each
//! subcommand claims its files first: [`claim`] creates the file (or opens
//! an existing one without truncating it), so a missing directory or a
//! read-only file is refused before any I/O starts.

use std::path::Path;

/// Create `path` (or open it if it exists) for writing, or say why not.
pub fn claim(path: &Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(drop)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Claim every file that is given.
pub fn claim_all<'a>(paths: impl IntoIterator<Item = Option<&'a Path>>) -> Result<(), String> {
    paths.into_iter().flatten().try_for_each(claim)
}

/// Claim a `--plot` file: the charts are SVG (no bitmap renderer is
/// built in), so a name that says otherwise (`x.png`) is refused rather
/// than given SVG under a `.png` name.
pub fn claim_plot(path: Option<&Path>) -> Result<(), String> {
    let Some(path) = path else { return Ok(()) };
    let svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if !svg {
        return Err(format!(
            "--plot writes SVG: name the file .svg (e.g. {}), and convert it if you need a bitmap (rsvg-convert -o x.png x.svg)",
            path.with_extension("svg").display()
        ));
    }
    claim(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_must_be_named_svg() {
        let e = claim_plot(Some(Path::new("/nonexistent/x.png"))).unwrap_err();
        assert!(e.contains("x.svg"), "{e}");
        assert!(claim_plot(Some(Path::new("/nonexistent/dir/x.SVG")))
            .unwrap_err()
            .starts_with("cannot write"));
        assert_eq!(claim_plot(None), Ok(()));
    }

    #[test]
    fn claim_creates_or_refuses() {
        let dir = std::env::temp_dir().join(format!("mcqio-claim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.txt");
        std::fs::write(&f, "kept").unwrap();
        claim(&f).unwrap();
        assert_eq!(
            std::fs::read_to_string(&f).unwrap(),
            "kept",
            "not truncated"
        );
        let new = dir.join("b.svg");
        claim_all([Some(new.as_path()), None]).unwrap();
        assert!(new.exists());
        let e = claim(&dir.join("no/such/dir.svg")).unwrap_err();
        assert!(
            e.starts_with("cannot write ") && e.contains("No such file"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
