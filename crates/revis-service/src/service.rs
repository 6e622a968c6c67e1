//! revis's two services described once: [`Service`] (names, files,
//! variables) and the two there are, [`REVISD`] and [`SERVE`].

use crate::units::{REVISD_UNITS, SERVE_UNITS, Unit};

/// One of revis's services: what the reports call it, its files, and what
/// it takes from the command that installs it. Everything that acts on a
/// service reads it from here; [`REVISD`] and [`SERVE`] are the two there are.
#[derive(Debug)]
pub struct Service {
    /// The program, as the reports name it: `revisd`, `revis serve`.
    pub name: &'static str,
    /// The binary's file name: `revisd`, `revis`.
    pub binary: &'static str,
    /// The command that manages the service, as the reports name it.
    pub command: &'static str,
    /// What `status` advises when the installed file is not the one this command would write.
    pub rewrites: &'static str,
    /// Variables passed on to the service when they are set at install.
    pub env: &'static [Passed],
    /// systemd: the units, each after those it needs (`Requires=`); the
    /// last one runs the program.
    pub units: &'static [Unit],
    /// launchd: the job's label, and the plist's file name without `.plist`.
    pub label: &'static str,
    /// launchd: the LaunchAgent's template (`launchd/*.plist`, embedded).
    pub plist: &'static str,
    /// launchd: the log file's name, in `~/Library/Logs/revis`.
    pub log: &'static str,
    /// Whether the manager holds a socket for it ([`Layout::socket`](crate::Layout::socket)).
    pub socket: bool,
}

/// A variable of the installing process that the service gets too.
#[derive(Debug)]
pub struct Passed {
    pub name: &'static str,
    /// A path, made absolute (the service does not run where the install did).
    pub path: bool,
}

/// revisd: `revisd.socket` + `revisd.service`, `org.revis.revisd`.
pub static REVISD: Service = Service {
    name: "revisd",
    binary: "revisd",
    command: "revisd service",
    rewrites: "`revisd service install` rewrites it with this command's revisd, --config and REVIS_DATA_DIR",
    env: &[Passed { name: "REVIS_DATA_DIR", path: true }],
    units: REVISD_UNITS,
    label: "org.revis.revisd",
    plist: include_str!("../../../launchd/revisd.plist"),
    log: "revisd.log",
    socket: true,
};

/// `revis serve`: `revis-serve.service`, `org.revis.serve`. It reaches
/// revisd on revisd's own socket, so it needs no socket of its own.
pub static SERVE: Service = Service {
    name: "revis serve",
    binary: "revis",
    command: "revis serve",
    rewrites: "`revis serve install` with the same flags rewrites it with this command's revis, REVIS_DATA_DIR and REVIS_MDNS_INTERFACES",
    env: &[Passed { name: "REVIS_DATA_DIR", path: true }, Passed { name: "REVIS_MDNS_INTERFACES", path: false }],
    units: SERVE_UNITS,
    label: "org.revis.serve",
    plist: include_str!("../../../launchd/revis-serve.plist"),
    log: "serve.log",
    socket: false,
};
