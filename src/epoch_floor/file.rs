//! The floor file's reads and writes (the only I/O of the epoch floor).

use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
};

use super::{FILE_NAME, FloorError, parse};

/// The floor file in a state dir (see the module docs).
#[derive(Clone, Debug)]
pub struct FloorFile {
    dir: PathBuf,
}

impl FloorFile {
    /// The floor file of `dir`; the directory is created if missing.
    pub fn open(dir: &Path) -> Result<FloorFile, FloorError> {
        fs::create_dir_all(dir).map_err(|source| FloorError::Io {
            action: "create",
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(FloorFile { dir: dir.to_path_buf() })
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// The stored floor; `None` when there is no file yet (a first run).
    pub fn read(&self) -> Result<Option<u64>, FloorError> {
        let path = self.path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(FloorError::Io { action: "read", path, source }),
        };
        match parse(&text) {
            Some(floor) => Ok(Some(floor)),
            None => Err(FloorError::Corrupt { path, text: text.chars().take(64).collect() }),
        }
    }

    /// Replaces the floor with `floor`, durably: temporary file, fsync, rename, fsync of
    /// the directory (so the rename itself survives a power cut).
    pub fn write(&self, floor: u64) -> Result<(), FloorError> {
        let path = self.path();
        let temp = self.dir.join(format!("{FILE_NAME}.tmp"));
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| FloorError::Io { action, path, source }
        };
        let mut file = fs::File::create(&temp).map_err(io("create", &temp))?;
        file.write_all(format!("{floor}\n").as_bytes()).map_err(io("write", &temp))?;
        file.sync_all().map_err(io("fsync", &temp))?;
        drop(file);
        fs::rename(&temp, &path).map_err(io("rename onto", &path))?;
        let dir = fs::File::open(&self.dir).map_err(io("open", &self.dir))?;
        dir.sync_all().map_err(io("fsync", &self.dir))?;
        Ok(())
    }
}
