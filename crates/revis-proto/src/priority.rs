//! Whose work a call is. Defined once, here, beside [`crate::Tier`],
//! because both sides of the wire name it: the client marks each call, the
//! daemon's queue orders by it.

/// The user's work runs before any background work queued; within one
/// priority, first come first served. Ordered so that the more urgent is
/// the greater.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Work nobody is waiting on: titles, memory, pre-prefill, checks.
    Background,
    /// What a person waits for. The default.
    #[default]
    User,
}

impl Priority {
    /// The wire's value (`revis.v1.Priority`).
    pub fn to_wire(self) -> i32 {
        match self {
            Priority::User => crate::v1::Priority::User as i32,
            Priority::Background => crate::v1::Priority::Background as i32,
        }
    }

    /// The priority a wire field names; unspecified or unknown values are
    /// the user's, as the contract says.
    pub fn from_wire(p: i32) -> Priority {
        match crate::v1::Priority::try_from(p) {
            Ok(crate::v1::Priority::Background) => Priority::Background,
            _ => Priority::User,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_orders() {
        for p in [Priority::User, Priority::Background] {
            assert_eq!(Priority::from_wire(p.to_wire()), p);
        }
        assert_eq!(Priority::from_wire(0), Priority::User);
        assert_eq!(Priority::from_wire(99), Priority::User);
        assert!(Priority::User > Priority::Background);
        assert_eq!(Priority::default(), Priority::User);
    }
}
