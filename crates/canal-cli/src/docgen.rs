//! `canal completions SHELL` and `canal man DIR`: shell completions and man pages
//! generated from the same command definitions that parse the command line, so they
//! cannot drift from it. `scripts/install` installs both.

use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell
    #[arg(value_name = "SHELL")]
    shell: clap_complete::Shell,
}

#[derive(clap::Args, Debug)]
pub(crate) struct ManArgs {
    /// Directory to write canal.1, canal-SUBCOMMAND.1 and canald.8 into
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

/// Prints the completion script for `canal` (the command `canal`, as defined) and
/// `canald` (appended) in `a.shell`.
pub(crate) fn completions(a: &CompletionsArgs, mut canal: clap::Command) -> i32 {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut canal, "canal", &mut out);
    clap_complete::generate(a.shell, &mut canald::cli::command(), "canald", &mut out);
    canald::output::print_or_fail("canal completions", &String::from_utf8_lossy(&out))
}

/// Writes the man pages of `canal` (the command, as defined) and canald into `a.dir`
/// and names each file written.
pub(crate) fn man(a: &ManArgs, canal: clap::Command) -> i32 {
    match write_pages(&a.dir, canal) {
        Ok(files) => {
            let list: String = files.iter().map(|f| format!("{}\n", f.display())).collect();
            canald::output::print_or_fail("canal man", &list)
        }
        Err(e) => {
            eprintln!("canal man: {}: {e}", a.dir.display());
            1
        }
    }
}

fn write_pages(dir: &Path, mut canal: clap::Command) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut page = |cmd: clap::Command, name: String, section: &str| -> std::io::Result<()> {
        let path = dir.join(format!("{name}.{section}"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd)
            .title(name.to_uppercase())
            .section(section)
            .manual("canal")
            .render(&mut buf)?;
        std::fs::write(&path, buf)?;
        written.push(path);
        Ok(())
    };
    // Built, so that subcommands carry their full names ("canal run") in the pages.
    canal.build();
    for sub in canal
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        page(sub.clone(), format!("canal-{}", sub.get_name()), "1")?;
    }
    page(canal, "canal".into(), "1")?;
    page(canald::cli::command(), "canald".into(), "8")?;
    Ok(written)
}
