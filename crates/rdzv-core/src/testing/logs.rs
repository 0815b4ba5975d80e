//! The logs of test servers that the harnesses start again in the same directory: each
//! start appends to the same file, and only what one start wrote says how it went.

use std::io;
use std::path::Path;

/// What the file at `path` holds past its first `offset` bytes (its length when this start
/// began), as text (invalid UTF-8 replaced).
pub fn read_since(path: &Path, offset: u64) -> io::Result<String> {
    let bytes = std::fs::read(path)?;
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[start..]).into_owned())
}

/// The last `n` lines of `text`, for an error message that shows how a server's start ended.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a\nb", 5), "a\nb");
        assert_eq!(last_lines("", 3), "");
    }

    #[test]
    fn only_what_was_written_past_the_offset_is_read() {
        let dir = tempfile_dir();
        let path = dir.join("log");
        std::fs::write(&path, "first start: fatal\n").expect("written");
        let offset = std::fs::metadata(&path).expect("its length").len();
        assert_eq!(read_since(&path, offset).expect("read"), "");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| io::Write::write_all(&mut f, b"second start: ready\n"))
            .expect("appended");
        assert_eq!(read_since(&path, offset).expect("read"), "second start: ready\n");
        assert_eq!(read_since(&path, u64::MAX).expect("read"), "");
        std::fs::remove_dir_all(&dir).expect("removed");
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("rdzv-logs-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        dir
    }
}
