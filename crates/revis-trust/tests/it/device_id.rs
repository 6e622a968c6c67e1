//! The device ID's readable form: grouped, checked, parsed back.

use expect_test::expect;
use revis_trust::{DeviceId, Identity};

#[test]
fn formats_as_eight_groups_of_seven_and_parses_back() {
    let id = DeviceId::of_certificate(b"revis test certificate");
    let text = id.to_string();
    expect!["KPLVSLA-QWCZBLZ-4HFKRTO-TEQGGYM-TS4WNOD-J55SA3N-HDE76BQ-YEG5GQB"].assert_eq(&text);
    let groups: Vec<&str> = text.split('-').collect();
    assert_eq!(groups.len(), 8);
    assert!(groups.iter().all(|g| g.len() == 7));
    assert_eq!(text.parse::<DeviceId>().unwrap(), id);
}

#[test]
fn parsing_ignores_case_dashes_and_spaces() {
    let id = Identity::generate().unwrap().device_id();
    let text = id.to_string();
    let loose = text.to_lowercase().replace('-', " ");
    assert_eq!(loose.parse::<DeviceId>().unwrap(), id);
    assert_eq!(text.replace('-', "").parse::<DeviceId>().unwrap(), id);
}

#[test]
fn every_single_mistyped_character_is_rejected() {
    let id = DeviceId::from_bytes([0x5a; 32]);
    let text: Vec<u8> = id.to_string().into_bytes();
    for i in (0..text.len()).filter(|&i| text[i] != b'-') {
        for c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567" {
            if *c == text[i] {
                continue;
            }
            let mut typo = text.clone();
            typo[i] = *c;
            let typo = String::from_utf8(typo).unwrap();
            assert!(typo.parse::<DeviceId>().is_err(), "{typo} was accepted");
        }
    }
}

#[test]
fn malformed_text_is_rejected_with_a_reason() {
    let check = |input: &str, reason: &str| {
        let err = input.parse::<DeviceId>().unwrap_err().to_string();
        assert!(err.contains(reason), "{input:?}: {err}");
    };
    check("", "56 characters");
    check("ABCDEFG-ABCDEFG", "56 characters");
    let id = DeviceId::from_bytes([7; 32]).to_string();
    check(&format!("{id}A"), "56 characters");
    check(&id.replacen(|c: char| c.is_ascii_alphabetic(), "1", 1), "A-Z");
}

#[test]
fn serializes_as_its_readable_form() {
    let id = DeviceId::from_bytes([1; 32]);
    let json = serde_json::to_string(&id).unwrap();
    assert_eq!(json, format!("\"{id}\""));
    assert_eq!(serde_json::from_str::<DeviceId>(&json).unwrap(), id);
    assert!(serde_json::from_str::<DeviceId>("\"nope\"").is_err());
}
