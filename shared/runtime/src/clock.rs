//! The wall clock as gpusched timestamps count it. Owns the one place the
//! shell reads the time of day; must never be called from the core.

use gpusched_model::Timestamp;

/// Now as gpusched timestamps count it: milliseconds since the Unix epoch.
pub fn wall_clock() -> Timestamp {
    // A clock set before 1970 reads as the epoch itself.
    let ms = chrono::Utc::now().timestamp_millis().max(0);
    Timestamp(ms.unsigned_abs())
}
