//! canald's configuration: `Config` and its defaults (`model`), the options that set it
//! (`args`: command line and file keys), configuration files (`file`), and the
//! layering of defaults, files and command line with each value's origin (`layers`).
mod args;
pub(crate) mod file;
pub(crate) mod layers;
mod model;

pub use args::DaemonArgs;
pub use model::{default_socket_path, Config, ConfigError, Setting};
