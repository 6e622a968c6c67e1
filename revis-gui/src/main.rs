//! `revis-gui`: logging, the paths and settings ([`revis_gui::Options`]), the window.

use eframe::egui;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("REVIS_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or the journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Every path (the data folder chosen in the settings among them) is resolved here and passed down.
    let opts = revis_gui::Options::from_env()?;
    let native = eframe::NativeOptions {
        // The app ID names the folder eframe keeps the window's size and place in
        // (persist_window, on by default), and the window's class for the desktop.
        viewport: egui::ViewportBuilder::default()
            .with_title("revis")
            .with_app_id("revis")
            .with_inner_size([1100.0, 760.0])
            .with_min_inner_size([640.0, 420.0]),
        ..Default::default()
    };
    eframe::run_native("revis", native, Box::new(move |cc| Ok(Box::new(revis_gui::App::new(opts, &cc.egui_ctx)))))
        .map_err(|e| anyhow::anyhow!("the window could not be opened: {e}"))
}
