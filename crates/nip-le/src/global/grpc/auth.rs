//! etcd user authentication: a token from `Auth.Authenticate`, sent as
//! the `token` metadata of every call and watch, taken again when etcd
//! refuses it (expired, or the auth store changed, or a restart forgot it). Attempts are
//! spaced: a wrong password costs one request per [`RETRY`], not a loop.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::etcd::EtcdAuth;

use super::super::etcd::{EtcdError, Result};

/// The least time between two failed authentications.
pub(super) const RETRY: Duration = Duration::from_secs(1);

/// One user's credentials and current token.
pub(crate) struct Auth {
    creds: EtcdAuth,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    token: Option<String>,
    /// The last failed authentication: when, and why.
    failed: Option<(Instant, EtcdError)>,
}

impl Auth {
    pub(super) fn new(creds: EtcdAuth) -> Self {
        Self {
            creds,
            state: Mutex::default(),
        }
    }

    pub(super) fn user(&self) -> &str {
        &self.creds.user
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current token, or a new one from `authenticate(user, password)`
    /// (not sooner than [`RETRY`] after a failed one: its error again).
    pub(super) fn token(
        &self,
        authenticate: impl FnOnce(&str, &str) -> Result<String>,
    ) -> Result<String> {
        let mut s = self.state();
        if let Some(t) = &s.token {
            return Ok(t.clone());
        }
        if let Some((at, e)) = &s.failed {
            if at.elapsed() < RETRY {
                return Err(e.clone());
            }
        }
        match authenticate(&self.creds.user, self.creds.password()) {
            Ok(t) => {
                s.token = Some(t.clone());
                s.failed = None;
                Ok(t)
            }
            Err(e) => {
                s.failed = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// Drops `token` (etcd refused it); a newer token stays.
    pub(crate) fn forget(&self, token: &str) {
        let mut s = self.state();
        if s.token.as_deref() == Some(token) {
            s.token = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_authentication_is_not_retried_at_once() {
        let a = Auth::new(EtcdAuth::new("u", "p"));
        let mut tries = 0;
        for _ in 0..5 {
            let r = a.token(|u, p| {
                tries += 1;
                assert_eq!((u, p), ("u", "p"));
                Err(EtcdError::refused("authentication failed"))
            });
            assert!(r.is_err());
        }
        assert_eq!(tries, 1, "one request per RETRY");
    }

    #[test]
    fn a_refused_token_is_taken_again() {
        let a = Auth::new(EtcdAuth::new("u", "p"));
        assert_eq!(a.token(|_, _| Ok("t1".into())).unwrap(), "t1");
        assert_eq!(a.token(|_, _| panic!("cached")).unwrap(), "t1");
        a.forget("t0");
        assert_eq!(a.token(|_, _| panic!("still valid")).unwrap(), "t1");
        a.forget("t1");
        assert_eq!(a.token(|_, _| Ok("t2".into())).unwrap(), "t2");
    }
}
