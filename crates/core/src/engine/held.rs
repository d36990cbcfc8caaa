//! What a sequence holds: its own, or lent by the caller.

use std::ops::{Deref, DerefMut};

/// A value a [`super::Sequence`] owns (a server's request) or borrows for
/// the length of one call (the one-shot drivers
/// [`crate::generate::generate`] and
/// [`crate::speculative::generate_speculative`] lend the caller's state,
/// drafter and samplers, which the caller keeps afterwards).
pub enum Held<'a, T: ?Sized> {
    Owned(Box<T>),
    Borrowed(&'a mut T),
}

impl<T> Held<'_, T> {
    pub fn owned(value: T) -> Self {
        Held::Owned(Box::new(value))
    }
}

impl<T: ?Sized> Deref for Held<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Held::Owned(b) => b,
            Held::Borrowed(r) => r,
        }
    }
}

impl<T: ?Sized> DerefMut for Held<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match self {
            Held::Owned(b) => b,
            Held::Borrowed(r) => r,
        }
    }
}
