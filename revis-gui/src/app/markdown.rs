//! An answer as Markdown: the prose through egui_commonmark, each code block
//! drawn here (highlighted by egui_extras' small highlighter, selectable, with
//! a "Copy code" button that has a name, where egui_commonmark's own button
//! is a glyph egui's fonts lack).

use eframe::egui;
use egui_commonmark::{CommonMarkCache, CommonMarkViewer};
use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

/// A piece of an answer: prose, or a code block's language and code.
#[derive(Debug, PartialEq, Eq)]
pub enum Segment<'a> {
    Prose(&'a str),
    Code { lang: String, code: String },
}

/// Cuts `md` at its code blocks (fenced or indented, at any depth; one still
/// open while the answer streams runs to the end; a code block's last
/// line break is not part of its code).
pub fn segments(md: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let (mut prose_from, mut open): (usize, Option<(String, String)>) = (0, None);
    for (event, range) in Parser::new_ext(md, pulldown_cmark::Options::ENABLE_TABLES).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(kind)) => {
                let prose = md[prose_from..range.start].trim_end_matches([' ', '>']);
                if !prose.trim().is_empty() {
                    out.push(Segment::Prose(prose));
                }
                let lang = match kind {
                    CodeBlockKind::Fenced(info) => info.split_whitespace().next().unwrap_or_default().to_owned(),
                    CodeBlockKind::Indented => String::new(),
                };
                open = Some((lang, String::new()));
                prose_from = range.end;
            }
            Event::Text(t) if open.is_some() => {
                if let Some((_, code)) = open.as_mut() {
                    code.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => {
                if let Some((lang, code)) = open.take() {
                    let code = code.strip_suffix('\n').unwrap_or(&code).to_owned();
                    out.push(Segment::Code { lang, code });
                }
                prose_from = range.end;
            }
            _ => {}
        }
    }
    if let Some((lang, code)) = open {
        out.push(Segment::Code { lang, code });
    } else if !md[prose_from..].trim().is_empty() {
        out.push(Segment::Prose(&md[prose_from..]));
    }
    out
}

/// Draws `md`.
pub fn show(ui: &mut egui::Ui, cache: &mut CommonMarkCache, md: &str) {
    for (i, s) in segments(md).into_iter().enumerate() {
        ui.push_id(i, |ui| match s {
            Segment::Prose(text) => {
                CommonMarkViewer::new().show(ui, cache, &images_as_links(text));
            }
            Segment::Code { lang, code } => code_block(ui, &lang, &code),
        });
    }
}

/// Images become links: the app fetches nothing an answer names (and has
/// no image loaders), so `![alt](url)` shows as the link `alt`.
pub fn images_as_links(md: &str) -> std::borrow::Cow<'_, str> {
    if !md.contains("![") {
        return md.into();
    }
    let bangs: Vec<usize> = Parser::new_ext(md, pulldown_cmark::Options::ENABLE_TABLES)
        .into_offset_iter()
        .filter_map(|(e, r)| matches!(e, Event::Start(Tag::Image { .. })).then_some(r.start))
        .filter(|&at| md.as_bytes().get(at) == Some(&b'!'))
        .collect();
    let mut out = String::with_capacity(md.len());
    let mut from = 0;
    for at in bangs {
        out.push_str(&md[from..at]);
        from = at + 1;
    }
    out.push_str(&md[from..]);
    out.into()
}

fn code_block(ui: &mut egui::Ui, lang: &str, code: &str) {
    let theme = egui_extras::syntax_highlighting::CodeTheme::from_style(ui.style());
    let job = egui_extras::syntax_highlighting::highlight(ui.ctx(), ui.style(), &theme, code, if lang.is_empty() { "txt" } else { lang });
    egui::Frame::new()
        .fill(ui.visuals().extreme_bg_color)
        .stroke(ui.visuals().widgets.noninteractive.bg_stroke)
        .corner_radius(4.0)
        .inner_margin(6.0)
        .show(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal(|ui| {
                ui.weak(if lang.is_empty() { "code" } else { lang });
                ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
                    if ui.small_button("Copy code").on_hover_text("Copy this code block").clicked() {
                        ui.ctx().copy_text(code.to_owned());
                    }
                });
            });
            ui.add(egui::Label::new(job).selectable(true).wrap_mode(egui::TextWrapMode::Extend));
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(lang: &str, code: &str) -> Segment<'static> {
        Segment::Code { lang: lang.into(), code: code.into() }
    }

    #[test]
    fn code_blocks_are_cut_out_of_the_prose() {
        let md = "Intro *text*.\n\n```python\nprint(1)\nprint(2)\n```\n\nAfter.\n";
        assert_eq!(
            segments(md),
            [Segment::Prose("Intro *text*.\n\n"), code("python", "print(1)\nprint(2)"), Segment::Prose("\n\nAfter.\n")]
        );
        assert_eq!(segments("No code here."), [Segment::Prose("No code here.")]);
        assert_eq!(segments("    indented\n"), [code("", "indented")]);
    }

    #[test]
    fn images_become_links_and_nothing_else_changes() {
        assert_eq!(
            images_as_links("See ![a cat](https://x/cat.png) and [a dog](https://x/d)!"),
            "See [a cat](https://x/cat.png) and [a dog](https://x/d)!"
        );
        assert_eq!(images_as_links("Wow! [x](y)"), "Wow! [x](y)");
        assert_eq!(images_as_links("`![not an image](z)`"), "`![not an image](z)`", "code spans stay");
    }

    #[test]
    fn a_block_still_streaming_runs_to_the_end_and_one_in_a_list_is_cut_too() {
        assert_eq!(segments("Here:\n```rust\nfn main() {\n"), [Segment::Prose("Here:\n"), code("rust", "fn main() {")]);
        let list = "1. One\n2. Two:\n   ```sh\n   ls\n   ```\n3. Three\n";
        let s = segments(list);
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s[1], code("sh", "ls"));
        assert!(matches!(s[2], Segment::Prose(p) if p.contains("3. Three")), "{s:?}");
    }
}
