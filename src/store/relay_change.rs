//! An operator's change to a relay (docs/CONTRACT.md §10): retry its
//! failed effects, skip a parked one, rewind its cursor. One rule for every
//! way an operator asks: the `relays` command (`--retry`, `--skip`,
//! `--rewind`) and `serve`'s `POST /relays/{name}/...` both call
//! [`change_relay`], so the same change on the same relay does the same
//! thing and is refused for the same reason, in the same words.

use super::{OutboxStore, StoreError};
use std::fmt;
use std::time::SystemTime;

/// What an operator asks of a relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayChange {
    /// Its failed effects tried again now, from the first attempt of their
    /// schedule; with a position, only the failed effect there (refused
    /// when the effect there is not failed).
    Retry {
        /// The outbox position of the one effect to retry (`None`: all).
        position: Option<u64>,
    },
    /// Its parked effect at `position` dropped without delivery; its
    /// object's next effect goes.
    Skip {
        /// The outbox position of the parked effect.
        position: u64,
    },
    /// Its cursor moved to `position` (at most the last outbox position):
    /// what follows is delivered again, with the same ids.
    Rewind {
        /// The new cursor.
        position: u64,
    },
}

/// What a change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayChanged {
    /// This many failed effects are to be retried now (0 when the relay had
    /// none and no position was named).
    Retried {
        /// How many.
        effects: u64,
    },
    /// The parked effect at this position was dropped.
    Skipped {
        /// Its outbox position.
        position: u64,
    },
    /// The cursor is at this position now.
    Rewound {
        /// The new cursor.
        position: u64,
    },
}

impl fmt::Display for RelayChanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RelayChanged::Retried { effects } => {
                write!(f, "{effects} failed effect(s) to be retried now")
            }
            RelayChanged::Skipped { position } => {
                write!(f, "the effect at position {position} skipped")
            }
            RelayChanged::Rewound { position } => write!(f, "rewound to position {position}"),
        }
    }
}

/// Why a change was refused; nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RelayChangeRefused {
    /// The store knows no relay of this name.
    #[error("no relay named {0:?} in this store")]
    UnknownRelay(String),
    /// A retry named a position where the relay has no failed effect.
    #[error("relay {relay:?} has no failed effect at position {position}")]
    NotFailed {
        /// The relay.
        relay: String,
        /// The position named.
        position: u64,
    },
    /// A skip named a position where the relay has no parked effect.
    #[error("relay {relay:?} has no parked effect at position {position}")]
    NotParked {
        /// The relay.
        relay: String,
        /// The position named.
        position: u64,
    },
    /// A rewind named a position past the outbox's last.
    #[error("position {position} is past the last outbox position {last}")]
    PastLast {
        /// The position named.
        position: u64,
        /// The last outbox position.
        last: u64,
    },
}

impl RelayChangeRefused {
    /// Whether the refusal names something the store does not have (a
    /// relay, or an effect at a position), rather than a position that
    /// cannot be: HTTP answers the first 404, the second 400.
    pub fn is_not_found(&self) -> bool {
        !matches!(self, RelayChangeRefused::PastLast { .. })
    }
}

/// Applies `change` to relay `name` on `store` at `now`: `Ok(Ok(what it
/// did))`, or `Ok(Err(why it was refused))` with nothing changed. A
/// change raises the relay's generation, so a running relay notices it at
/// its next save and reads its state again.
///
/// # Errors
/// The store's error when it cannot be read or written.
pub fn change_relay(
    store: &mut dyn OutboxStore,
    name: &str,
    change: RelayChange,
    now: SystemTime,
) -> Result<Result<RelayChanged, RelayChangeRefused>, StoreError> {
    if !store.relays()?.iter().any(|r| r.name == name) {
        return Ok(Err(RelayChangeRefused::UnknownRelay(name.to_owned())));
    }
    let relay = || name.to_owned();
    Ok(match change {
        RelayChange::Retry { position } => {
            let effects = store.retry_failed(name, position, now)?;
            match position {
                Some(position) if effects == 0 => Err(RelayChangeRefused::NotFailed {
                    relay: relay(),
                    position,
                }),
                _ => Ok(RelayChanged::Retried { effects }),
            }
        }
        RelayChange::Skip { position } => {
            if store.skip(name, position, now)? {
                Ok(RelayChanged::Skipped { position })
            } else {
                Err(RelayChangeRefused::NotParked {
                    relay: relay(),
                    position,
                })
            }
        }
        RelayChange::Rewind { position } => {
            let last = store.last_position()?;
            if position > last {
                Err(RelayChangeRefused::PastLast { position, last })
            } else {
                store.rewind(name, position, now)?;
                Ok(RelayChanged::Rewound { position })
            }
        }
    })
}
