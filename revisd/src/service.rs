//! `revisd service install | uninstall | status | logs`: the arguments, and
//! the hand-over to revis-service, which does the work.

use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;
use revis_service::{InstallOptions, Layout, LogOptions};

/// Run revisd in the background: a LaunchAgent on macOS, a systemd user service on Linux.
#[derive(Subcommand)]
pub enum Action {
    /// Install and start the service for this revisd binary (and --config, if given). Safe to run again.
    Install {
        /// Write the service files but do not load, enable or start them.
        #[arg(long)]
        no_start: bool,
        /// Print the files and the commands; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Stop the service and remove its files; models, configuration and logs stay.
    Uninstall {
        /// Print what would be done; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Whether the service is installed and running, and whether revisd answers on its socket (exit 3 if not).
    Status,
    /// Show the daemon's log (the user journal on Linux, the log file on macOS).
    Logs {
        /// Keep showing new lines.
        #[arg(short, long)]
        follow: bool,
        /// How many of the last lines to show.
        #[arg(short = 'n', long, default_value_t = 100)]
        lines: u32,
    },
}

/// LSB's "program is not running", as `systemctl status` answers.
const EX_NOT_RUNNING: u8 = 3;

pub fn run(action: Action, config: Option<&Path>) -> ExitCode {
    let result = Layout::revisd(config).and_then(|layout| {
        let out = &mut std::io::stdout();
        match action {
            Action::Install { no_start, dry_run } => {
                revis_service::install(&layout, InstallOptions { no_start, dry_run }, out).map(|()| ExitCode::SUCCESS)
            }
            Action::Uninstall { dry_run } => revis_service::uninstall(&layout, dry_run, out).map(|()| ExitCode::SUCCESS),
            Action::Status => {
                revis_service::status(&layout, out).map(|answers| if answers { ExitCode::SUCCESS } else { ExitCode::from(EX_NOT_RUNNING) })
            }
            Action::Logs { follow, lines } => {
                revis_service::logs(&layout, LogOptions { lines, follow }).map(|code| ExitCode::from(u8::try_from(code).unwrap_or(1)))
            }
        }
    });
    result.unwrap_or_else(|e| {
        eprintln!("revisd service: {e}");
        ExitCode::FAILURE
    })
}
