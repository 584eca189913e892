//! `SHA256SUMS` in a checkpoint directory, in the format `sha256sum` writes and checks: when
//! the file is there, every file it lists is hashed before the model loads, and one that is
//! missing or differs is refused by name. The demo pair the repository ships carries one, so
//! that a truncated clone or a corrupted file fails at load instead of serving a wrong model.

use std::io::Read;
use std::path::{Component, Path};

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};

/// The file's name inside a checkpoint directory.
pub const CHECKSUMS_FILE: &str = "SHA256SUMS";

/// One line of the file: a file of the directory and the digest it must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedDigest {
    /// Relative to the directory.
    pub file: String,
    /// Lower-case hex SHA-256.
    pub sha256: String,
}

/// Checks `dir` against its `SHA256SUMS`, if it has one; returns how many files were checked
/// (0 without the file).
pub fn verify_checksums(dir: &Path) -> Result<usize> {
    let list = dir.join(CHECKSUMS_FILE);
    let text = match std::fs::read_to_string(&list) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => return Err(ModelError::Io { path: list, source }),
    };
    let expected = parse(&text).map_err(|message| ModelError::InvalidFile { path: list.clone(), message })?;
    for entry in &expected {
        let path = dir.join(&entry.file);
        let found = sha256_of(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => {
                ModelError::MissingFile { path: path.clone(), what: format!("listed in {}", list.display()) }
            }
            _ => ModelError::Io { path: path.clone(), source },
        })?;
        if found != entry.sha256 {
            return Err(ModelError::Checksum { path, expected: entry.sha256.clone(), found });
        }
    }
    Ok(expected.len())
}

/// Parses `sha256sum` output: `<64 hex digits> <space or *><name>` a line; names stay inside
/// the directory.
pub fn parse(text: &str) -> std::result::Result<Vec<ExpectedDigest>, String> {
    let mut entries = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
        let (digest, rest) = line.split_at_checked(64).ok_or_else(|| bad("shorter than a SHA-256 digest"))?;
        if !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("the digest is not 64 hex digits"));
        }
        let file = rest
            .strip_prefix("  ")
            .or_else(|| rest.strip_prefix(" *"))
            .ok_or_else(|| bad("expected two spaces (or a space and *) after the digest"))?;
        let inside = !file.is_empty()
            && Path::new(file).components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !inside {
            return Err(bad("the file must be a path inside the checkpoint directory"));
        }
        entries.push(ExpectedDigest { file: file.to_owned(), sha256: digest.to_ascii_lowercase() });
    }
    Ok(entries)
}

/// The lower-case hex SHA-256 of a file, read in chunks.
pub fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &[u8])]) -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("specd-checksums-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        dir
    }

    /// SHA-256 of "abc" (FIPS 180-2, appendix B.1): the hash is the standard one.
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn matching_files_pass_and_a_changed_byte_is_refused_by_name() {
        let dir = dir_with(&[("config.json", b"abc"), (CHECKSUMS_FILE, format!("{ABC}  config.json\n").as_bytes())]);
        assert_eq!(verify_checksums(&dir).unwrap(), 1);
        std::fs::write(dir.join("config.json"), b"abd").unwrap();
        let err = verify_checksums(&dir).unwrap_err();
        assert!(matches!(&err, ModelError::Checksum { expected, .. } if expected == ABC), "{err}");
        assert!(err.to_string().contains("config.json"), "{err}");
        std::fs::remove_file(dir.join("config.json")).unwrap();
        let err = verify_checksums(&dir).unwrap_err();
        assert!(matches!(err, ModelError::MissingFile { .. }) && err.to_string().contains("config.json"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_directory_without_the_file_is_not_checked() {
        let dir = dir_with(&[("config.json", b"abc")]);
        assert_eq!(verify_checksums(&dir).unwrap(), 0);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn malformed_lines_and_paths_outside_the_directory_are_refused() {
        let ok = format!("{ABC}  a\n\n{ABC} *sub/b\n");
        assert_eq!(parse(&ok).unwrap().len(), 2);
        for bad in [
            format!("{}  a", &ABC[..60]),
            format!("{}  a", "g".repeat(64)),
            format!("{ABC} a"),
            format!("{ABC}  ../secret"),
            format!("{ABC}  /etc/passwd"),
            format!("{ABC}  "),
        ] {
            assert!(parse(&bad).is_err(), "{bad:?} was accepted");
        }
    }
}
