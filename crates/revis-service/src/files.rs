//! The service's files: which ones `install` writes for this platform's
//! manager, with their contents, and the arguments read back from an
//! installed one.

use std::path::{Path, PathBuf};

use crate::error::{ServiceError, io_error};
use crate::launchd::{self, plist};
use crate::layout::{Layout, Manager};
use crate::systemd::{self, unit_file};

impl Layout {
    /// The files `install` writes, with their contents.
    pub fn files(&self) -> Result<Vec<(PathBuf, String)>, ServiceError> {
        match self.manager {
            Manager::Systemd => {
                self.service.units.iter().map(|u| unit_file(self, u).map(|text| (self.systemd_dir.join(u.name), text))).collect()
            }
            Manager::Launchd => Ok(vec![(self.program_file(), plist(self)?)]),
        }
    }

    /// The arguments the installed service runs its program with, read back
    /// from its file (the unit's ExecStart, the LaunchAgent's
    /// ProgramArguments). `None` when it is not installed, or its file is
    /// not one `install` writes.
    pub fn installed_arguments(&self) -> Result<Option<Vec<String>>, ServiceError> {
        let path = self.program_file();
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidData) => return Ok(None),
            Err(e) => return Err(io_error(&path)(e)),
        };
        Ok(match self.manager {
            Manager::Systemd => systemd::exec_arguments(&text),
            Manager::Launchd => launchd::program_arguments(&text),
        })
    }
}

/// Writes `content` to `path` through a temporary file and a rename, so the
/// manager never reads half a file.
pub(crate) fn write_file(path: &Path, content: &str) -> Result<(), ServiceError> {
    let dir = path.parent().expect("service files live in a directory");
    std::fs::create_dir_all(dir).map_err(io_error(dir))?;
    let tmp = dir.join(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("revis"), std::process::id()));
    std::fs::write(&tmp, content).map_err(io_error(&tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_error(path)(e)
    })
}
