//! `core::qpair` tested once, directly, against a stub wire (issue 39
//! item 6): the gate, the poll skeleton, budgets and held completions,
//! recovery, waiting, closing and dropping, as every wire gets them. The
//! per-wire suites test what is each wire's own.
//!
//! - [`stub`]: an in-memory device and a queue pair over it implementing
//!   only the required hooks of `Wire`, driven by a script;
//! - [`ledger`]: the harness's own record of every command and the rules
//!   it checks (ended once, with its own buffer, never while the device
//!   holds it, the device's status kept; counters that agree);
//! - [`lifecycle`]: named cases, one rule each;
//! - [`props`]: random scripts.

mod ledger;
mod lifecycle;
mod props;
mod stub;
