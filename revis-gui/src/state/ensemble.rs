//! A tier's ensemble as the Tiers view edits it: the fields as typed,
//! read into an ensemble (or why not), and shown from a stored one.

use revis_client::ensemble::{EnsembleSpec, MemberSpec, Method};

/// A tier's ensemble as the Tiers view edits it: the members as typed
/// (comma-separated) and the method.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnsembleFields {
    pub members: String,
    pub method: Method,
}

impl EnsembleFields {
    /// The fields showing a stored ensemble.
    pub fn of(spec: &EnsembleSpec) -> EnsembleFields {
        let members: Vec<String> = spec.members.iter().map(MemberSpec::to_string).collect();
        EnsembleFields { members: members.join(", "), method: spec.method }
    }

    /// The members typed; empty pieces (a trailing comma) are skipped.
    pub fn members(&self) -> Result<Vec<MemberSpec>, String> {
        self.members.split(',').map(str::trim).filter(|m| !m.is_empty()).map(str::parse).collect()
    }

    /// The ensemble these fields set, switched on; its other settings
    /// (span, gate, deadline) are `base`'s. Not yet checked: the I/O side
    /// checks it before it saves it.
    pub fn spec(&self, base: &EnsembleSpec) -> Result<EnsembleSpec, String> {
        Ok(EnsembleSpec { enabled: true, members: self.members()?, method: self.method, ..base.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensemble_fields_read_what_was_typed_and_show_what_was_stored() {
        let fields = EnsembleFields { members: " tier2,desk top/tier3 , ".into(), method: Method::Merge };
        let base = EnsembleSpec { span_tokens: 8, ..EnsembleSpec::default() };
        let spec = fields.spec(&base).unwrap();
        assert!(spec.enabled);
        assert_eq!(spec.members, ["tier2".parse().unwrap(), "desk top/tier3".parse().unwrap()]);
        assert_eq!((spec.method, spec.span_tokens), (Method::Merge, 8), "the method typed, the rest as it was");
        assert_eq!(EnsembleFields::of(&spec), EnsembleFields { members: "tier2, desk top/tier3".into(), method: Method::Merge });
        let bad = EnsembleFields { members: "tier2, tier9".into(), method: Method::Cross };
        assert!(bad.spec(&base).unwrap_err().contains("tier9"));
    }
}
