//! `revis-gui`: logging, the data folder chosen in the settings, the window.

use eframe::egui;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("REVIS_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let config = revis_gui::settings::config_path()?;
    if std::env::var_os("REVIS_DATA_DIR").is_none_or(|v| v.is_empty())
        && let Some(dir) = revis_gui::settings::saved_data_dir(&config)
    {
        // SAFETY: no other thread exists yet; the daemon this app starts inherits it too.
        unsafe { std::env::set_var("REVIS_DATA_DIR", dir) };
    }
    let opts = revis_gui::Options::from_env()?;
    let native = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default().with_title("revis").with_inner_size([980.0, 680.0]).with_min_inner_size([640.0, 420.0]),
        ..Default::default()
    };
    eframe::run_native("revis", native, Box::new(move |cc| Ok(Box::new(revis_gui::App::new(opts, &cc.egui_ctx)))))
        .map_err(|e| anyhow::anyhow!("the window could not be opened: {e}"))
}
