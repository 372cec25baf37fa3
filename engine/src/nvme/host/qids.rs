//! The I/O queue ids a controller granted: each queue pair takes one for
//! its life and gives it back when it is dropped.

use std::sync::Mutex;

use crate::core::error::{Error, Result};

/// Queue ids 1 to the grant, those not held by a queue pair.
#[derive(Debug)]
pub(in crate::nvme) struct QidPool {
    granted: u16,
    free: Mutex<Vec<u16>>,
}

impl QidPool {
    /// All of 1..=`granted` free (handed out lowest first).
    pub(in crate::nvme) fn new(granted: u16) -> Self {
        QidPool {
            granted,
            free: Mutex::new((1..=granted).rev().collect()),
        }
    }

    /// How many the controller granted.
    pub(in crate::nvme) fn granted(&self) -> u16 {
        self.granted
    }

    /// How many are free.
    pub(in crate::nvme) fn free(&self) -> usize {
        self.lock().len()
    }

    /// Take one: [`Error::NoFreeQueue`] when every one is held.
    pub(in crate::nvme) fn alloc(&self) -> Result<u16> {
        self.lock().pop().ok_or(Error::NoFreeQueue {
            granted: usize::from(self.granted),
        })
    }

    /// Give `qid` back.
    pub(in crate::nvme) fn release(&self, qid: u16) {
        debug_assert!(
            (1..=self.granted).contains(&qid),
            "qid {qid} was never granted"
        );
        self.lock().push(qid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u16>> {
        // A panic elsewhere leaves the list itself whole.
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_lowest_first_and_run_out_with_a_typed_error() {
        let p = QidPool::new(2);
        assert_eq!(p.alloc().unwrap(), 1);
        assert_eq!(p.alloc().unwrap(), 2);
        assert!(matches!(p.alloc(), Err(Error::NoFreeQueue { granted: 2 })));
        p.release(1);
        assert_eq!(p.free(), 1);
        assert_eq!(p.alloc().unwrap(), 1);
        assert_eq!(p.free(), 0);
    }
}
