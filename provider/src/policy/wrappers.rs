//! Programs that run other commands, and tools whose global options come before a subcommand:
//! the two tables a `Bash` rule sees through.
//!
//! [`inner`] knows the programs that run their arguments (or an argument) as a command or as
//! shell code, and how each takes its options:
//!
//! - shells: `sh`, `bash`, `dash`, `zsh`, `ksh`, `mksh`, `ash`, `yash`, `posh`, `fish` (`-c`
//!   code; no `-c` and no script: the code on their input, a here-document or here-string is
//!   judged, a pipe or a file is not decidable; a script file is not decidable);
//! - shell builtins: `eval`, `exec`, `command`, `builtin`, `trap` (its action), `source` and
//!   `.` (not decidable: code from a file);
//! - coreutils: `env` (also `-S`), `nice`, `nohup`, `timeout`, `stdbuf`, `chroot`; `time`;
//! - findutils: `xargs` (the command gets its input as further arguments), `find -exec`,
//!   `-execdir`, `-ok`, `-okdir`;
//! - util-linux: `setsid`, `flock` (command or `-c`), `taskset`, `ionice`, `chrt`, `prlimit`,
//!   `setpriv`, `unshare`, `nsenter`, `runuser`, `su` (`-c`), `script` (`-c`);
//! - others: `sudo`, `doas`, `pkexec`, `sg`, `watch`, `parallel` (GNU), `busybox`, `strace`,
//!   `ltrace`, `coproc`, `fakeroot`, `unbuffer`, `eatmydata`, `catchsegv`, `valgrind`,
//!   `dbus-run-session`; `git -c` settings that git runs as shell code (`core.pager`,
//!   `core.sshCommand`, `alias.x=!…`, …).
//!
//! Where a wrapper puts its input (`xargs -I{}`, `find -exec … {}`, `parallel`'s `{}`), the
//! word is data, not a literal: a program or shell code made of it is not decidable. A line
//! that sets a variable deciding which file runs ([`LOADER_VARIABLES`]: `PATH`, `LD_PRELOAD`, …)
//! is not decidable either.
//!
//! [`normalise`] drops the global options of `git`, `docker` and `cargo` before their
//! subcommand (`git -C repo push` is `git push` to a rule).

use super::word::Word;

/// What a wrapper runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Inner {
    /// These words as a command.
    Command(Vec<Word>),
    /// This text as shell code.
    Code(Word),
    /// The shell code on its standard input.
    Stdin,
    /// Something the line cannot tell, and why.
    Unknown(String),
}

/// Directories whose programs are the system's, not files the agent wrote.
const SYSTEM_DIRS: &[&str] = &[
    "/bin/",
    "/sbin/",
    "/usr/bin/",
    "/usr/sbin/",
    "/usr/local/bin/",
    "/usr/local/sbin/",
];

/// Whether `path` names a program in the system's directories (`/usr/bin/rm`).
pub(super) fn is_system_program(path: &str) -> bool {
    SYSTEM_DIRS.iter().any(|dir| {
        path.strip_prefix(dir)
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('/'))
    })
}

/// Global options before a subcommand, which take a separate value (flags are any other word
/// starting with `-` before the subcommand).
const GLOBAL_OPTIONS: &[(&str, &[&str])] = &[
    (
        "git",
        &[
            "-C",
            "-c",
            "--git-dir",
            "--work-tree",
            "--namespace",
            "--config-env",
            "--attr-source",
            "--super-prefix",
        ],
    ),
    (
        "docker",
        &[
            "-H",
            "--host",
            "-c",
            "--context",
            "--config",
            "-l",
            "--log-level",
            "--tlscacert",
            "--tlscert",
            "--tlskey",
        ],
    ),
    ("cargo", &["-C", "-Z", "--config", "--color"]),
];

/// The command as a rule sees it: `name` then its arguments, without the global options of a
/// tool in [`GLOBAL_OPTIONS`]; an error when the line defines what the subcommand means
/// (`git -c alias.x=…`).
pub(super) fn normalise(name: &str, args: &[Word]) -> Result<Vec<String>, String> {
    let mut words = vec![name.to_owned()];
    let Some((_, with_value)) = GLOBAL_OPTIONS.iter().find(|(tool, _)| *tool == name) else {
        words.extend(args.iter().map(|w| w.value.clone()));
        return Ok(words);
    };
    let mut at = 0;
    while let Some(arg) = args.get(at) {
        let value = arg.value.as_str();
        if !arg.literal || !(value.starts_with('-') || (name == "cargo" && value.starts_with('+')))
        {
            break;
        }
        if value == "--" {
            at += 1;
            break;
        }
        let (option, inline) = match value.split_once('=') {
            Some((option, inline)) if option.starts_with("--") => (option, Some(inline)),
            _ => (value, None),
        };
        let takes_value = with_value.contains(&option);
        let setting = match (takes_value, inline) {
            (true, Some(inline)) => Some(inline.to_owned()),
            (true, None) => {
                at += 1;
                args.get(at).map(|w| w.value.clone())
            }
            _ => None,
        };
        if name == "git"
            && matches!(option, "-c" | "--config-env")
            && setting.as_deref().is_some_and(|s| {
                s.to_ascii_lowercase().starts_with("alias.")
                    && !s.split_once('=').is_some_and(|(_, v)| v.starts_with('!'))
            })
        {
            return Err(
                "the line defines a git alias (-c alias.…): write the git command \
                        literally"
                    .to_owned(),
            );
        }
        at += 1;
    }
    words.extend(args.iter().skip(at).map(|w| w.value.clone()));
    Ok(words)
}

/// What `name` run with `args` runs in turn (nothing for a program that is no wrapper).
pub(super) fn inner(name: &str, args: &[Word]) -> Vec<Inner> {
    let command = |at: usize| command_from(args, at);
    match name {
        "sh" | "bash" | "dash" | "zsh" | "ksh" | "mksh" | "ash" | "yash" | "posh" | "fish"
        | "rbash" => shell(name, args),
        "eval" => vec![Inner::Code(Word::join(args))],
        "source" | "." => vec![Inner::Unknown(format!(
            "{name} runs shell code from a file the rules cannot read: write the commands \
             literally"
        ))],
        "exec" => command(options(args, "a", &[])),
        "command" | "builtin" | "nohup" | "busybox" => command(options(args, "", &[])),
        "trap" => trap(args),
        "env" => env(args),
        "nice" => command(options(args, "n", &["--adjustment"])),
        "time" => command(options(args, "fo", &["--format", "--output"])),
        "timeout" => command(options(args, "sk", &["--signal", "--kill-after"]).saturating_add(1)),
        "stdbuf" => command(options(args, "ioe", &["--input", "--output", "--error"])),
        "chroot" => command(options(args, "", &["--userspec", "--groups"]).saturating_add(1)),
        "setsid" => command(options(args, "", &[])),
        "ionice" | "taskset" | "chrt" | "prlimit" => scheduler(name, args),
        "setpriv" => command(options(args, "", SETPRIV_VALUE_OPTIONS)),
        "unshare" => command(options(args, "SGRw", UNSHARE_VALUE_OPTIONS)),
        "nsenter" => command(options(
            args,
            "tSGnN",
            &["--target", "--setuid", "--setgid", "--env"],
        )),
        "flock" => flock(args),
        "runuser" | "su" => su(name, args),
        "sg" => sg(args),
        "script" => option_values(args, 'c', "--command")
            .into_iter()
            .map(Inner::Code)
            .collect(),
        "sudo" => sudo(args),
        "doas" => command(options(args, "uC", &[])),
        "pkexec" => command(options(args, "", &["--user"])),
        "watch" => watch(args),
        "parallel" => parallel(args),
        "xargs" => xargs(args),
        "find" => find(args),
        "strace" | "ltrace" => command(options(args, "abeEIoOpPsSuUX", &[])),
        // `coproc NAME { …; }` reaches us as words when the grammar misses the group.
        "coproc"
            if args
                .iter()
                .any(|w| w.value == "{" || w.value.starts_with('(')) =>
        {
            vec![Inner::Unknown(
                "coproc runs a compound command the parser did not read: write it plainly"
                    .to_owned(),
            )]
        }
        "coproc" | "catchsegv" | "eatmydata" | "unbuffer" | "dbus-run-session" | "valgrind" => {
            command(options(args, "", &[]))
        }
        "fakeroot" => command(options(args, "lsi", &["--lib", "--faked"])),
        "hash" if has_flag(args, 'p', "") => vec![Inner::Unknown(
            "hash -p makes a name run a file the rules cannot read: write the command literally"
                .to_owned(),
        )],
        "git" => git_code(args),
        _ => Vec::new(),
    }
}

/// The command `args` hold from index `at` on (nothing when none is left).
fn command_from(args: &[Word], at: usize) -> Vec<Inner> {
    match args.get(at..) {
        Some(rest) if !rest.is_empty() => vec![Inner::Command(rest.to_vec())],
        _ => Vec::new(),
    }
}

/// `setpriv`'s long options that take a value.
const SETPRIV_VALUE_OPTIONS: &[&str] = &[
    "--reuid",
    "--regid",
    "--ruid",
    "--rgid",
    "--euid",
    "--egid",
    "--groups",
    "--securebits",
    "--pdeathsig",
    "--selinux-label",
    "--apparmor-profile",
    "--inh-caps",
    "--ambient-caps",
    "--bounding-set",
    "--landlock-access",
    "--landlock-rule",
    "--ptracer",
];

/// `unshare`'s long options that take a value.
const UNSHARE_VALUE_OPTIONS: &[&str] = &[
    "--setuid",
    "--setgid",
    "--root",
    "--wd",
    "--propagation",
    "--setgroups",
    "--map-user",
    "--map-group",
    "--map-users",
    "--map-groups",
    "--monotonic",
    "--boottime",
];

/// `trap ACTION SIGNAL…`: the action is shell code (`-` resets, runs nothing).
fn trap(args: &[Word]) -> Vec<Inner> {
    let at = options(args, "", &[]);
    match args.get(at..) {
        Some([action, _signal, ..]) if !action.is("-") => vec![Inner::Code(action.clone())],
        _ => Vec::new(),
    }
}

/// `sg GROUP [-c] CODE`: the code runs as a shell command.
fn sg(args: &[Word]) -> Vec<Inner> {
    let at = options(args, "", &[]).saturating_add(1);
    match args.get(at..) {
        Some([flag, code, ..]) if flag.is("-c") => vec![Inner::Code(code.clone())],
        Some(rest) if !rest.is_empty() => vec![Inner::Code(Word::join(rest))],
        _ => Vec::new(),
    }
}

/// `watch [-x] …`: a command with `-x`, else shell code.
fn watch(args: &[Word]) -> Vec<Inner> {
    let at = options(
        args,
        "nq",
        &["--interval", "--equexit", "--errexit-command", "--precise"],
    );
    let exec = has_flag(&args[..at.min(args.len())], 'x', "--exec");
    match args.get(at..) {
        Some(rest) if !rest.is_empty() && exec => vec![Inner::Command(rest.to_vec())],
        Some(rest) if !rest.is_empty() => vec![Inner::Code(Word::join(rest))],
        _ => Vec::new(),
    }
}

/// The scheduling wrappers (`ionice`, `taskset`, `chrt`, `prlimit`): the command they start,
/// nothing when they act on a running process (`-p`/`--pid`).
fn scheduler(name: &str, args: &[Word]) -> Vec<Inner> {
    let command = |at: usize| command_from(args, at);
    match name {
        "ionice" => {
            let at = options(args, "cnu", &["--class", "--classdata", "--uid"]);
            if has_flag(&args[..at], 'p', "--pid") || has_flag(&args[..at], 'P', "--pgid") {
                return Vec::new();
            }
            command(at)
        }
        "taskset" => {
            let at = options(args, "", &[]);
            if has_flag(&args[..at], 'p', "--pid") {
                return Vec::new();
            }
            command(at + 1)
        }
        "chrt" => {
            let at = options(
                args,
                "T",
                &["--sched-runtime", "--sched-period", "--sched-deadline"],
            );
            if has_flag(&args[..at], 'p', "--pid") {
                return Vec::new();
            }
            command(at + 1)
        }
        "prlimit" => {
            let at = options(args, "p", &["--pid", "--output"]);
            if has_flag(&args[..at], 'p', "--pid") {
                return Vec::new();
            }
            command(at)
        }
        _ => Vec::new(),
    }
}

/// The index of the first operand after `args`' options: `short` are the letters whose option
/// takes a value (inline or the next word), `long` the long options that do (inline after `=`
/// or the next word). A word that is not literal ends the options.
fn options(args: &[Word], short: &str, long: &[&str]) -> usize {
    let mut at = 0;
    while let Some(arg) = args.get(at) {
        let value = arg.value.as_str();
        if !arg.literal || value == "-" || !value.starts_with('-') {
            return at;
        }
        if value == "--" {
            return at + 1;
        }
        if let Some(long_name) = value.strip_prefix("--") {
            let takes = !long_name.contains('=') && long.contains(&value);
            at += if takes { 2 } else { 1 };
            if at >= args.len() {
                return args.len();
            }
            continue;
        }
        let letters = &value[1..];
        let mut skip = 1;
        for (index, letter) in letters.char_indices() {
            if short.contains(letter) {
                if index + letter.len_utf8() == letters.len() {
                    skip = 2;
                }
                break;
            }
        }
        at += skip;
    }
    at.min(args.len())
}

/// Whether the options of `args` include `-<short>` (alone or among letters) or `long`.
fn has_flag(args: &[Word], short: char, long: &str) -> bool {
    args.iter().any(|arg| {
        let value = arg.value.as_str();
        (!long.is_empty() && (value == long || value.starts_with(&format!("{long}="))))
            || (value.starts_with('-') && !value.starts_with("--") && value[1..].contains(short))
    })
}

/// The values `args` give option `-<short>` or `long`: `-c x`, `-qc x`, `-cx`, `--command x`,
/// `--command=x`, wherever they stand (more found than the program takes is on the safe side).
fn option_values(args: &[Word], short: char, long: &str) -> Vec<Word> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(arg) = args.get(at) {
        at += 1;
        let value = arg.value.as_str();
        let inline = if let Some(rest) = value.strip_prefix(long) {
            match rest.strip_prefix('=') {
                Some(inline) => Some(inline),
                None if rest.is_empty() => Some(""),
                None => None,
            }
        } else if value.starts_with('-') && !value.starts_with("--") {
            value[1..]
                .find(short)
                .and_then(|index| value.get(1 + index + short.len_utf8()..))
        } else {
            None
        };
        match inline {
            Some("") => {
                if let Some(next) = args.get(at) {
                    found.push(next.clone());
                    at += 1;
                }
            }
            Some(inline) => found.push(Word {
                value: inline.to_owned(),
                ..arg.clone()
            }),
            None => {}
        }
    }
    found
}

/// A shell's arguments: `-c` code, a script, or its input.
fn shell(name: &str, args: &[Word]) -> Vec<Inner> {
    let mut has_c = false;
    let mut at = 0;
    while let Some(arg) = args.get(at) {
        let value = arg.value.as_str();
        if !arg.literal {
            break;
        }
        if value == "--" || value == "-" {
            at += 1;
            break;
        }
        if matches!(
            value,
            "--rcfile" | "--init-file" | "-o" | "+o" | "-O" | "+O"
        ) {
            at += 2;
            continue;
        }
        if value.starts_with("--") {
            if value == "--command" {
                has_c = true;
            }
            at += 1;
            continue;
        }
        if let Some(letters) = value.strip_prefix('-').or_else(|| value.strip_prefix('+')) {
            has_c |= value.starts_with('-') && letters.contains('c');
            at += 1;
            continue;
        }
        break;
    }
    match args.get(at) {
        Some(code) if has_c => vec![Inner::Code(code.clone())],
        None if has_c => Vec::new(),
        Some(script) => vec![Inner::Unknown(format!(
            "{name} runs a script file the rules cannot read ({}): write the commands literally",
            script.value
        ))],
        None => vec![Inner::Stdin],
    }
}

/// Variables that decide which file runs or is read as code (`PATH=. ls`,
/// `BASH_ENV=x bash -c …`, `LD_PRELOAD=x.so ls`): a line that sets one is not decidable.
pub(super) const LOADER_VARIABLES: &[&str] = &[
    "PATH",
    "BASH_ENV",
    "ENV",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "GIT_EXEC_PATH",
];

/// `env [options] [NAME=value…] command`, `-S` splitting a string into the command.
fn env(args: &[Word]) -> Vec<Inner> {
    let sets_loader = args.iter().any(|w| {
        w.value
            .split_once('=')
            .is_some_and(|(name, _)| LOADER_VARIABLES.contains(&name))
    });
    let mut found = Vec::new();
    if sets_loader {
        found.push(Inner::Unknown(
            "env sets a variable that decides which program runs (PATH, LD_PRELOAD, …): write \
             the command literally"
                .to_owned(),
        ));
    }
    let mut at = 0;
    while let Some(arg) = args.get(at) {
        let value = arg.value.as_str();
        if !arg.literal {
            break;
        }
        let split = if value == "-S" || value == "--split-string" {
            at += 1;
            args.get(at).cloned()
        } else {
            value
                .strip_prefix("--split-string=")
                .or_else(|| value.strip_prefix("-S"))
                .map(|inline| Word {
                    value: inline.to_owned(),
                    ..arg.clone()
                })
        };
        if let Some(split) = split {
            let mut code = vec![split];
            code.extend(args.iter().skip(at + 1).cloned());
            found.push(Inner::Code(Word::join(&code)));
            return found;
        }
        if value == "--" {
            at += 1;
            break;
        }
        if matches!(value, "-u" | "-C" | "-P" | "--unset" | "--chdir") {
            at += 2;
        } else if (value.starts_with('-') && value != "-") || is_assignment(value) {
            at += 1;
        } else {
            break;
        }
    }
    // Assignments may follow `--` too.
    while args
        .get(at)
        .is_some_and(|w| w.literal && is_assignment(&w.value))
    {
        at += 1;
    }
    if let Some(rest) = args.get(at..).filter(|rest| !rest.is_empty()) {
        found.push(Inner::Command(rest.to_vec()));
    }
    found
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// `flock [options] file command…`, `flock [options] file -c code`, `flock fd`.
fn flock(args: &[Word]) -> Vec<Inner> {
    let at = options(
        args,
        "Ewc",
        &["--timeout", "--wait", "--conflict-exit-code", "--command"],
    );
    let mut found: Vec<Inner> = option_values(&args[..at], 'c', "--command")
        .into_iter()
        .map(Inner::Code)
        .collect();
    // The lock file, then the command or `-c` code.
    match args.get(at + 1..) {
        Some([flag, code, ..]) if flag.is("-c") || flag.is("--command") => {
            found.push(Inner::Code(code.clone()));
        }
        Some(rest) if !rest.is_empty() => found.push(Inner::Command(rest.to_vec())),
        _ => {}
    }
    found
}

/// `su [options] [-] [user [shell arguments…]]`, `runuser -u user command…`.
fn su(name: &str, args: &[Word]) -> Vec<Inner> {
    let mut found: Vec<Inner> = option_values(args, 'c', "--command")
        .into_iter()
        .chain(option_values(args, 'C', "--session-command"))
        .map(Inner::Code)
        .collect();
    let at = options(
        args,
        "cCsgGwu",
        &[
            "--command",
            "--session-command",
            "--shell",
            "--group",
            "--supp-group",
            "--whitelist-environment",
            "--user",
        ],
    );
    let given = &args[..at];
    let at = if args.get(at).is_some_and(|w| w.is("-")) {
        at + 1
    } else {
        at
    };
    if name == "runuser" && has_flag(given, 'u', "--user") {
        if let Some(rest) = args.get(at..).filter(|rest| !rest.is_empty()) {
            found.push(Inner::Command(rest.to_vec()));
        }
        return found;
    }
    // The user, then arguments for the user's shell (`su root -c 'rm x'` is found above).
    if let Some(rest) = args.get(at + 1..).filter(|rest| !rest.is_empty()) {
        let mut argv = vec![Word::literal("sh")];
        argv.extend(rest.iter().cloned());
        found.push(Inner::Command(argv));
    }
    found
}

/// `sudo [options] [NAME=value…] command…`; with `-s` or `-i` the command goes to a shell.
fn sudo(args: &[Word]) -> Vec<Inner> {
    let mut at = options(
        args,
        "ugCDhprtTUR",
        &[
            "--user",
            "--group",
            "--close-from",
            "--chdir",
            "--host",
            "--prompt",
            "--role",
            "--type",
            "--command-timeout",
            "--other-user",
            "--chroot",
        ],
    );
    let given = &args[..at.min(args.len())];
    if has_flag(given, 'e', "--edit") || has_flag(given, 'l', "--list") {
        return Vec::new();
    }
    while args
        .get(at)
        .is_some_and(|w| w.literal && is_assignment(&w.value))
    {
        at += 1;
    }
    let Some(rest) = args.get(at..).filter(|rest| !rest.is_empty()) else {
        return Vec::new();
    };
    let given = &args[..at.min(args.len())];
    let through_shell = has_flag(given, 's', "--shell") || has_flag(given, 'i', "--login");
    if through_shell {
        // sudo escapes each word for the shell it runs.
        vec![Inner::Code(Word::join_quoted(rest))]
    } else {
        vec![Inner::Command(rest.to_vec())]
    }
}

/// Shell code git runs from a `-c name=value` setting before the subcommand (`core.pager`,
/// `core.sshCommand`, `alias.x=!…`, …); a setting that names files of code is not decidable.
fn git_code(args: &[Word]) -> Vec<Inner> {
    const RUNS: &[&str] = &[
        "pager",
        "editor",
        "sshcommand",
        "askpass",
        "fsmonitor",
        "helper",
        "external",
        "textconv",
        "command",
        "driver",
        "clean",
        "smudge",
        "process",
        "program",
        "gitproxy",
        "cmd",
    ];
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(arg) = args.get(at) {
        at += 1;
        if !arg.literal || !arg.value.starts_with('-') {
            break;
        }
        let setting = match arg.value.as_str() {
            "-c" => args.get(at).cloned(),
            "--config-env" => {
                return vec![Inner::Unknown(
                    "git takes a setting from the environment (--config-env): write the git \
                     command literally"
                        .to_owned(),
                )];
            }
            "-C" | "--git-dir" | "--work-tree" | "--namespace" | "--attr-source" => {
                at += 1;
                None
            }
            _ => None,
        };
        let Some(setting) = setting else { continue };
        at += 1;
        let Some((key, value)) = setting.value.split_once('=') else {
            continue;
        };
        let key = key.to_ascii_lowercase();
        if key == "core.hookspath" || key.starts_with("include") {
            return vec![Inner::Unknown(format!(
                "git -c {key} runs code from files the rules cannot read: write the git command \
                 literally"
            ))];
        }
        let alias = key.starts_with("alias.") && value.starts_with('!');
        if alias || RUNS.iter().any(|suffix| key.ends_with(suffix)) {
            found.push(Inner::Code(Word {
                value: value.strip_prefix('!').unwrap_or(value).to_owned(),
                ..setting.clone()
            }));
        }
    }
    found
}

/// GNU `parallel [options] command ::: arguments`; without a command it runs its input.
fn parallel(args: &[Word]) -> Vec<Inner> {
    let end = args
        .iter()
        .position(|w| w.value.starts_with(":::"))
        .unwrap_or(args.len());
    let at = options(
        &args[..end],
        "jPSadEIlLnNsCr",
        &[
            "--jobs",
            "--sshlogin",
            "--arg-file",
            "--delimiter",
            "--colsep",
            "--max-args",
            "--max-lines",
            "--max-chars",
            "--env",
            "--results",
            "--joblog",
            "--workdir",
            "--timeout",
            "--tmpdir",
            "--load",
            "--memfree",
            "--retries",
            "--basefile",
            "--return",
            "--transfer-file",
            "--tagstring",
        ],
    );
    match args.get(at..end) {
        Some(rest) if !rest.is_empty() => {
            // The arguments after `:::` (or from the input) go where a replacement string
            // (`{}`, `{.}`, `{1}`, …) stands, else at the end.
            let mut command = rest.to_vec();
            let replaced = from_input(&mut command, |w| w.contains('{') && w.contains('}'));
            if !replaced {
                command.push(Word::literal("{input}"));
            }
            vec![Inner::Code(Word::join(&command))]
        }
        _ => vec![Inner::Unknown(
            "parallel runs the commands of its input: write the commands literally".to_owned(),
        )],
    }
}

/// `xargs [options] command…`: the command gets the input's items as further arguments.
fn xargs(args: &[Word]) -> Vec<Inner> {
    let at = options(
        args,
        "adEILnPs",
        &[
            "--arg-file",
            "--delimiter",
            "--max-lines",
            "--max-args",
            "--max-procs",
            "--max-chars",
            "--process-slot-var",
        ],
    );
    let given = &args[..at.min(args.len())];
    let replaces = has_flag(given, 'I', "--replace") || has_flag(given, 'i', "");
    let mut argv: Vec<Word> = match args.get(at..) {
        Some(rest) if !rest.is_empty() => rest.to_vec(),
        _ => vec![Word::literal("echo")],
    };
    if replaces {
        // The input's items replace the replacement string (`{}` unless given).
        let mark = option_values(given, 'I', "--replace")
            .into_iter()
            .map(|w| w.value)
            .find(|v| !v.is_empty())
            .unwrap_or_else(|| "{}".to_owned());
        from_input(&mut argv, |w| w.contains(mark.as_str()));
    } else {
        argv.push(Word::literal("{input}"));
    }
    vec![Inner::Command(argv)]
}

/// Marks the words where a wrapper puts its input (`xargs -I{}`, `find -exec … {}`): they are
/// data, not literals, so a program or shell code made of them is not decidable. Whether any.
fn from_input(words: &mut [Word], holds: impl Fn(&str) -> bool) -> bool {
    let mut any = false;
    for word in words.iter_mut().filter(|w| holds(&w.value)) {
        word.literal = false;
        any = true;
    }
    any
}

/// `find … -exec command… ;` (also `+`, `-execdir`, `-ok`, `-okdir`), each one run.
fn find(args: &[Word]) -> Vec<Inner> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(arg) = args.get(at) {
        at += 1;
        if !matches!(arg.value.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir") {
            continue;
        }
        let start = at;
        while let Some(word) = args.get(at) {
            let ends = word.is(";")
                || (word.is("+") && at > start && args.get(at - 1).is_some_and(|w| w.is("{}")));
            if ends {
                break;
            }
            at += 1;
        }
        if let Some(command) = args.get(start..at).filter(|c| !c.is_empty()) {
            let mut command = command.to_vec();
            from_input(&mut command, |w| w.contains("{}"));
            found.push(Inner::Command(command));
        }
        at += 1;
    }
    found
}
