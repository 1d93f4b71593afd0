//! [`Elector::start`]: the elector with the global level its
//! configuration asks for. The one place that knows both the elector and
//! the etcd level (feature `etcd`), so that neither names the other's
//! house: the arrows run start → elector and start → global → elector.

use crate::config::Config;
use crate::elector::{global_level, Elector};
use crate::error::Result;
use crate::identity::InstanceId;

impl Elector {
    /// Validates `config` and starts the writer thread. `id` is this
    /// window's instance id (see [`InstanceId::from_env`]).
    ///
    /// A lock directory that is not the user's (another user owns it, or
    /// others may write in it) is refused here with
    /// [`Error::UnsafeLockDir`](crate::Error::UnsafeLockDir); one that merely
    /// cannot be created is the NIP's fail-safe (every window leads).
    pub fn start(config: Config, id: InstanceId) -> Result<Self> {
        config.validate()?;
        if let Err(e @ crate::Error::UnsafeLockDir { .. }) =
            crate::lockfile::ensure_dir(&config.lock_dir)
        {
            return Err(e);
        }
        let stores = Elector::file_stores(&config);
        let global_level = global_level_of(&config, &id);
        Elector::start_with(config, id, stores, global_level)
    }
}

/// The etcd contender, when the configuration names etcd.
#[cfg(feature = "etcd")]
fn global_level_of(config: &Config, id: &InstanceId) -> global_level::GlobalBuilder {
    let Some(mut etcd) = config.etcd.clone() else {
        return global_level::none();
    };
    let (id, timings) = (
        id.as_str().to_owned(),
        (config.stand_down, config.work_retention),
    );
    let lock_dir = config.lock_dir.clone();
    Box::new(move |tell, renewed| {
        if etcd.host_id.is_empty() {
            // No host id given: the one kept in the lock directory. One
            // that is there but no id is refused (someone wrote it); one
            // that cannot be kept (a read-only directory, no hard links)
            // is no reason not to run: the hostname stands in, as before.
            etcd.host_id = match crate::global::persisted_host_id(&lock_dir) {
                Ok(id) => id,
                Err(e) if crate::global::host_id_is_hostile(&e) => {
                    return Err(crate::config::ConfigError::Etcd(e).into())
                }
                Err(e) => {
                    let host = crate::host::here().host.clone();
                    tracing::warn!("{e}; using the hostname {host:?} as the host id");
                    host.unwrap_or_else(|| "unknown-host".to_owned())
                }
            };
        }
        let contender =
            crate::global::Contender::start(etcd, &id, timings, (tell, renewed), &lock_dir)
                .map_err(|e| crate::Error::io("<etcd thread>", e))?;
        Ok(Some(
            Box::new(contender) as Box<dyn global_level::GlobalLevel>
        ))
    })
}

#[cfg(not(feature = "etcd"))]
fn global_level_of(_: &Config, _: &InstanceId) -> global_level::GlobalBuilder {
    global_level::none()
}
