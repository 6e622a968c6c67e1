//! revisd's exit statuses (sysexits.h), shared by the daemon's start and
//! the admin commands.

/// sysexits.h: a bad config is a usage error.
pub const EX_USAGE: u8 = 64;
pub const EX_CANTCREAT: u8 = 73;
/// sysexits.h: the daemon these commands talk to is not running.
pub const EX_UNAVAILABLE: u8 = 69;
/// sysexits' EX_NOPERM: the socket is not this user's revisd (impersonation checks).
pub const EX_NOPERM: u8 = 77;
