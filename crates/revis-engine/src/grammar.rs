//! Why llama.cpp refused a grammar, in words a person can act on. Its
//! binding says only "Grammar call returned null"; the usual cause for a
//! grammar made from a JSON schema is llama.cpp's repetition limit, which a
//! schema reaches through `minItems`, `maxItems`, `minLength` or
//! `maxLength`.

/// llama.cpp's `MAX_REPETITION_THRESHOLD` (llama-grammar.cpp): a
/// repetition may ask for at most this many copies at least, and a
/// repetition's count times the size of what it repeats may not pass it.
pub const MAX_GRAMMAR_REPETITION: u64 = 2000;

/// The message for a grammar llama.cpp refused, when its repetitions
/// explain it; `None` when the grammar repeats nothing large enough to
/// be the cause (the caller keeps llama.cpp's own word).
pub fn over_repetition_limit(grammar: &str) -> Option<String> {
    let counts = repetitions(grammar);
    if let Some(min) = counts.iter().map(|&(min, _)| min).filter(|&m| m > MAX_GRAMMAR_REPETITION).max() {
        return Some(format!(
            "the schema needs one element repeated {min} times in a row (minItems or minLength ask for that); \
             llama.cpp's grammars allow at most {MAX_GRAMMAR_REPETITION}"
        ));
    }
    // A maximum over the limit is read as "no maximum" by llama.cpp, so only
    // counts within it multiply the size of what they repeat.
    let largest = counts
        .iter()
        .flat_map(|&(min, max)| [Some(min), max.filter(|&m| m <= MAX_GRAMMAR_REPETITION)])
        .flatten()
        .max()
        .filter(|&c| c > 1)?;
    Some(format!(
        "llama.cpp refused the grammar made from the schema: it repeats an element {largest} times \
         (minItems, maxItems, minLength or maxLength), and llama.cpp allows at most {MAX_GRAMMAR_REPETITION} \
         repeated elements in all (a count times the size of what it repeats); ask for fewer or shorter items"
    ))
}

/// Every `{m}`, `{m,}` and `{m,n}` of a GBNF grammar as (m, n), skipping
/// string literals and character classes, where a brace is text.
fn repetitions(grammar: &str) -> Vec<(u64, Option<u64>)> {
    let mut out = Vec::new();
    let mut chars = grammar.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' | '[' => {
                let close = if c == '"' { '"' } else { ']' };
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == close {
                        break;
                    }
                }
            }
            '#' => {
                // A comment runs to the end of its line.
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            '{' => {
                let body: String = chars.by_ref().take_while(|&d| d != '}').collect();
                let body: String = body.chars().filter(|c| !c.is_whitespace()).collect();
                let (min, max) = match body.split_once(',') {
                    Some((min, "")) => (min.parse().ok(), None),
                    Some((min, max)) => (min.parse().ok(), max.parse().ok()),
                    None => (body.parse().ok(), body.parse().ok()),
                };
                if let Some(min) = min {
                    out.push((min, max));
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_repetitions_but_not_braces_in_text() {
        let g = r#"root ::= "{" [{}] item{3} ("," item){0,5} x{7,} # not {9}
item ::= "\"{2}\"""#;
        assert_eq!(repetitions(g), vec![(3, Some(3)), (0, Some(5)), (7, None)]);
    }

    #[test]
    fn names_the_limit_a_schema_passes() {
        // What llama.cpp makes of schemas asking for too many items, then for items too many times over.
        let too_many = llama_cpp_2::json_schema_to_grammar(r#"{"type":"array","minItems":2500,"items":{"type":"integer"}}"#).unwrap();
        let m = over_repetition_limit(&too_many).expect("a minimum over the limit");
        assert!(m.contains("2499 times") && m.contains("at most 2000"), "{m}");

        let heavy = llama_cpp_2::json_schema_to_grammar(
            r#"{"type":"array","minItems":1500,"maxItems":1500,"items":{"type":"string","minLength":64}}"#,
        )
        .unwrap();
        let m = over_repetition_limit(&heavy).expect("counts times sizes");
        assert!(m.contains("2000"), "{m}");

        assert_eq!(over_repetition_limit(r#"root ::= "a" | "b""#), None, "nothing repeated: llama.cpp's own word stands");
    }
}
