//! `--json FILE`: created (or truncated) by rank 0 before the sweep, so a
//! path that cannot be written fails the run before any timing instead of
//! after it; the rows are written into it at the end.

use crate::error::BenchError;
use crate::row::{to_json, Row};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

/// The JSON file of a run, if it asked for one.
#[derive(Debug, Default)]
pub struct JsonFile {
    path: Option<PathBuf>,
    file: Mutex<Option<File>>,
}

impl JsonFile {
    /// The file at `path` (`None`: no JSON asked for), not opened yet.
    pub fn new(path: Option<PathBuf>) -> JsonFile {
        JsonFile {
            path,
            file: Mutex::new(None),
        }
    }

    fn error(&self, source: std::io::Error) -> BenchError {
        BenchError::Output {
            path: self
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            source,
        }
    }

    /// Creates (or truncates) the file; nothing without a path.
    pub fn open(&self) -> Result<(), BenchError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let file = File::create(path).map_err(|e| self.error(e))?;
        *self.file.lock().unwrap_or_else(|p| p.into_inner()) = Some(file);
        Ok(())
    }

    /// Writes `rows` as a JSON array into the file (opening it now if
    /// [`JsonFile::open`] was not called); nothing without a path.
    pub fn write(&self, rows: &[Row]) -> Result<(), BenchError> {
        if self.path.is_none() {
            return Ok(());
        }
        let mut slot = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            drop(slot);
            self.open()?;
            slot = self.file.lock().unwrap_or_else(|p| p.into_inner());
        }
        let Some(file) = slot.as_mut() else {
            return Ok(());
        };
        file.write_all(to_json(rows).as_bytes())
            .and_then(|()| file.flush())
            .map_err(|e| self.error(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opened_first_and_written_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.json");
        let json = JsonFile::new(Some(path.clone()));
        json.open().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        json.write(&[]).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "[]");
        let unopened = JsonFile::new(Some(dir.path().join("late.json")));
        unopened.write(&[]).unwrap();
        assert!(dir.path().join("late.json").exists());
        JsonFile::new(None).open().unwrap();
        JsonFile::new(None).write(&[]).unwrap();
    }

    #[test]
    fn an_unwritable_path_fails_at_open_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing/rows.json");
        let err = JsonFile::new(Some(path.clone())).open().unwrap_err();
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
}
