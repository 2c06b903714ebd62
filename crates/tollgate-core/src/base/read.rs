//! Reading an operator's file whole, up to a cap: a file too large to mean anything is refused
//! before it is held in memory.

use std::io::Read;
use std::path::Path;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("larger than {} MiB; refused", .cap_mib)]
    TooLarge { cap_mib: u64 },
    #[error("not UTF-8 text")]
    NotText,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The text of `path`, refused when it holds more than `cap_mib` MiB: a regular file by its
/// length, before any of it is read; anything else (a pipe, a device) once one byte past the
/// cap has been read, which is the most ever held.
pub fn read_capped(path: &Path, cap_mib: u64) -> Result<String, ReadError> {
    let cap = cap_mib << 20;
    let file = std::fs::File::open(path)?;
    let metadata = file.metadata()?;
    if metadata.is_file() && metadata.len() > cap {
        return Err(ReadError::TooLarge { cap_mib });
    }
    let mut bytes = Vec::new();
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(ReadError::TooLarge { cap_mib });
    }
    String::from_utf8(bytes).map_err(|_| ReadError::NotText)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_past_the_cap_is_refused_without_being_read_whole() {
        let dir = std::env::temp_dir().join(format!("tollgate-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big");
        // Sparse: 3 GiB of zeros that take no disk and, read whole, would take the memory.
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(3 << 30).unwrap();
        let refused = read_capped(&path, 1).unwrap_err();
        assert_eq!(refused.to_string(), "larger than 1 MiB; refused");
        // A stream has no length to look at: refused once it gives a byte past the cap.
        assert!(matches!(
            read_capped(Path::new("/dev/zero"), 1),
            Err(ReadError::TooLarge { cap_mib: 1 })
        ));
        file.set_len(1 << 20).unwrap();
        assert_eq!(
            read_capped(&path, 1).unwrap().len(),
            1 << 20,
            "the cap itself is fine"
        );
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(matches!(read_capped(&path, 1), Err(ReadError::NotText)));
        assert!(matches!(
            read_capped(&dir.join("absent"), 1),
            Err(ReadError::Io(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
