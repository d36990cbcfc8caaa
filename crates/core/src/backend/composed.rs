//! Which provided ops each backend type ran through their default
//! compositions, i.e. did not override: noted as they run, so the
//! conformance suite can report and check what each backend implements
//! itself ([`crate::conformance::default_compositions`]).

use std::sync::Mutex;

/// (backend type name, op) pairs seen so far, in first-seen order.
static SEEN: Mutex<Vec<(&'static str, &'static str)>> = Mutex::new(Vec::new());

/// Notes that backend type `B` ran `op`'s default composition. A lock and a
/// search of a few dozen pairs: small beside any op.
pub(crate) fn note<B: ?Sized>(op: &'static str) {
    let key = (std::any::type_name::<B>(), op);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&key) {
        seen.push(key);
    }
}

/// The ops whose default compositions backend type `B` ran so far, sorted.
pub fn composed_ops<B: ?Sized>() -> Vec<&'static str> {
    let name = std::any::type_name::<B>();
    let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let mut ops: Vec<_> = seen
        .iter()
        .filter(|(b, _)| *b == name)
        .map(|&(_, op)| op)
        .collect();
    ops.sort_unstable();
    ops
}
