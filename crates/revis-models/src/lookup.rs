//! What revis knows of a model by its name or its file: its chat gears
//! (from the catalog) and its sampling defaults (from the GGUF file, else
//! the catalog).

use std::path::Path;

use crate::catalog::{find, find_file};
use crate::gears::ChatGears;
use crate::gguf;
use crate::sampling::SamplingDefaults;

/// The gears of the model a tier runs, by its name (a catalog name) or,
/// failing that, its file's name (a path to a catalog file).
pub fn chat_gears(name: &str, path: &str) -> ChatGears {
    let file = std::path::Path::new(path).file_name().and_then(|f| f.to_str()).unwrap_or_default();
    find(name).or_else(|| find_file(file)).map_or(ChatGears::UNMEASURED, |e| e.chat)
}

/// The sampling defaults of the model a tier names `name` (a catalog name, a
/// Hugging Face reference or a path) whose file is `path`: the GGUF file's own
/// `general.sampling.*` keys (llama.cpp's convention), else the catalog's for
/// that name or file name, else none. Values outside the daemon's limits are
/// dropped. A file that cannot be read as GGUF publishes nothing.
pub fn sampling_defaults(name: &str, path: &Path) -> SamplingDefaults {
    let published = match gguf::sampling(path) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "no sampling metadata read");
            SamplingDefaults::NONE
        }
    };
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or_default();
    let catalog = find(name).or_else(|| find_file(file)).map_or(SamplingDefaults::NONE, |e| e.sampling);
    published.sane().or(catalog)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catalog_model_is_known_by_name_or_by_file_and_anything_else_is_unmeasured() {
        let smol = find("smollm2-135m-instruct").unwrap();
        assert!(smol.chat.measured);
        assert_eq!(chat_gears("smollm2-135m-instruct", ""), smol.chat);
        assert_eq!(chat_gears("/some/where/my-copy", "/models/SmolLM2-135M-Instruct.Q4_1.gguf"), smol.chat);
        assert_eq!(chat_gears("/models/mine.gguf", "/models/mine.gguf"), ChatGears::UNMEASURED);
    }

    #[test]
    fn a_file_that_is_not_gguf_falls_back_to_the_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let qwen = find("qwen2.5-3b-instruct").unwrap();
        let path = dir.path().join(qwen.file_name);
        std::fs::write(&path, b"not a model").unwrap();
        assert_eq!(sampling_defaults("/some/path/model.gguf", &path), qwen.sampling, "by file name");
        assert_eq!(sampling_defaults("qwen2.5-3b-instruct", &dir.path().join("x.gguf")), qwen.sampling, "by catalog name");
        assert_eq!(sampling_defaults("gemma3-270m", &path.with_file_name("y.gguf")), SamplingDefaults::NONE, "none published");
    }
}
