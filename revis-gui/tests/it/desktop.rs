//! Desktop conventions: the look (theme, text size) is a setting kept in
//! gui.toml and applied at once, the keyboard reaches the main actions, and
//! every control has a name (found here by it).

use eframe::egui::accesskit::Role;
use eframe::egui::{Key, Modifiers, Theme as EguiTheme};
use egui_kittest::kittest::Queryable;
use revis_gui::settings::{Appearance, Theme};
use revis_gui::state::View;

use crate::{harness, options, wait_until};

#[test]
fn the_look_is_set_by_menu_or_keys_applied_at_once_and_kept() {
    // No revisd here: the app says so, and its own settings still work.
    let data = tempfile::tempdir().unwrap();
    let opts = options(&data.path().join("nothing.sock"), data.path(), 16);
    let config = opts.config.clone();
    let mut h = harness(opts);
    wait_until(&mut h, "the app to give up on revisd", |h| h.query_by_label("Try again").is_some());

    h.get_by_label("Settings").click();
    h.run_ok();
    h.get_by_label("Theme").click();
    h.run_ok();
    h.get_by_label("Light").click();
    h.run_ok();
    h.run_ok();
    assert_eq!(h.ctx.theme(), EguiTheme::Light, "applied at once");
    h.key_press_modifiers(Modifiers::COMMAND, Key::Plus);
    h.run_ok();
    h.run_ok();
    assert_eq!(h.state().state.appearance.text_percent, 110);
    assert!((h.ctx.zoom_factor() - 1.1).abs() < 1e-3, "zoom {}", h.ctx.zoom_factor());
    // Kept for the next start (written by the I/O side, which says so).
    let want = Appearance { theme: Theme::Light, text_percent: 110 };
    wait_until(&mut h, "the look saved", |h| h.state().state.appearance_saved == Some(want));
    assert_eq!(Appearance::load(&config), want);

    // Ctrl+F: to the chat, the search box focused; Ctrl+L: the message box.
    h.key_press_modifiers(Modifiers::COMMAND, Key::F);
    h.run_ok();
    assert_eq!(h.state().state.view(), View::Chat);
    assert!(h.get_by_role_and_label(Role::TextInput, "Search conversations:").is_focused());
    h.key_press_modifiers(Modifiers::COMMAND, Key::L);
    h.run_ok();
    assert!(h.get_by_role_and_label(Role::MultilineTextInput, "Message:").is_focused());
    h.key_press_modifiers(Modifiers::COMMAND, Key::Num0);
    h.run_ok();
    assert_eq!(h.state().state.appearance.text_percent, 100);
}
