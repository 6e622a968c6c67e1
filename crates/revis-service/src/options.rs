//! What the commands take besides the [`Layout`](crate::Layout):
//! [`InstallOptions`] and [`LogOptions`].

/// What `install` does besides writing the files.
#[derive(Clone, Copy, Debug, Default)]
pub struct InstallOptions {
    /// Write the files but do not call the service manager.
    pub no_start: bool,
    /// Print what would be written and run; change nothing.
    pub dry_run: bool,
}

/// How much of the log to show.
#[derive(Clone, Copy, Debug)]
pub struct LogOptions {
    pub lines: u32,
    pub follow: bool,
}
