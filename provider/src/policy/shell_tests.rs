//! The `Bash` rules against the shell (issue 41): a table of command lines and their decisions,
//! properties over wrapped denied commands, and the parser on arbitrary input.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

fn rules(list: &[&str]) -> Vec<ToolRule> {
    list.iter().map(|r| ToolRule::parse(r).unwrap()).collect()
}

/// The issue's rules: `deny: ["Bash(rm *)"]`, `ask: ["Bash(git push*)"]`, default allow.
fn issue_policy() -> ToolPolicy {
    ToolPolicy {
        deny: rules(&["Bash(rm *)"]),
        ask: rules(&["Bash(git push*)"]),
        ..ToolPolicy::default()
    }
}

/// `decision` as the table writes it, `?` marking an undecidable line.
fn show(verdict: &Verdict) -> String {
    format!(
        "{}{}",
        verdict.decision,
        if verdict.undecidable.is_some() {
            "?"
        } else {
            ""
        }
    )
}

/// Every line of the table with its expected verdict under [`issue_policy`]: `deny`, `ask`,
/// `allow`, with `?` when the line is not decidable.
const TABLE: &[(&str, &str)] = &[
    // Lists, pipelines, `&&`/`||`, subshells, groups, substitutions, functions.
    ("rm -rf target", "deny"),
    ("cd x && rm -rf y", "deny"),
    ("ls; rm -rf y", "deny"),
    ("true || rm -rf y", "deny"),
    ("ls\nrm -rf y", "deny"),
    ("ls | rm -rf y", "deny"),
    ("rm -rf y &", "deny"),
    ("(rm -rf y)", "deny"),
    ("( cd x; (rm -rf y) )", "deny"),
    ("{ rm -rf y; }", "deny"),
    ("echo $(rm -rf y)", "deny"),
    ("echo `rm -rf y`", "deny"),
    ("echo \"$(rm -rf y)\"", "deny"),
    ("echo \"a $(echo $(rm -rf y))\"", "deny"),
    ("cat <(rm -rf y)", "deny"),
    ("tee >(rm -rf y) < x", "deny"),
    ("x=$(rm -rf y)", "deny"),
    ("FOO=1 rm -rf y", "deny"),
    ("export X=$(rm -rf y)", "deny"),
    ("local x=\"$(rm -rf y)\"", "deny"),
    ("ls > \"$(rm -rf y)\"", "deny"),
    ("[[ -n $(rm -rf y) ]]", "deny"),
    ("echo $(( $(rm -rf y) + 1 ))", "deny"),
    ("echo ${x:-$(rm -rf y)}", "deny"),
    ("if true; then rm -rf y; fi", "deny"),
    ("if rm -rf y; then :; fi", "deny"),
    ("while false; do rm -rf y; done", "deny"),
    ("for f in a b; do rm -rf \"$f\"; done", "deny"),
    ("for f in $(rm -rf y); do :; done", "deny"),
    ("case x in x) rm -rf y;; esac", "deny"),
    ("! rm -rf y", "deny"),
    ("f(){ rm -rf y; }; f", "deny"),
    ("function f { rm -rf y; }; f", "deny"),
    ("f() ( rm -rf y ); f", "deny"),
    ("cat <<EOF\n$(rm -rf y)\nEOF", "deny"),
    // Words after a redirection still belong to the command.
    ("nice > out rm -rf y", "deny"),
    ("sh 2>&1 -c 'rm -rf y'", "deny"),
    ("sh <<EOF -c 'rm -rf y'\nEOF", "deny"),
    ("bash <<'EOF'\n\\rm -rf y\nEOF", "deny?"),
    // Quotes and escapes removed; the program by its name, whatever path runs it.
    ("'rm' -rf y", "deny"),
    ("\"rm\" -rf y", "deny"),
    ("\\rm -rf y", "deny"),
    ("r\\m -rf y", "deny"),
    ("\"r\"m -rf y", "deny"),
    ("r'm' -rf y", "deny"),
    ("$'rm' -rf y", "deny"),
    ("$'\\x72m' -rf y", "deny"),
    ("$'\\162m' -rf y", "deny"),
    ("rm '-rf' \"y\"", "deny"),
    ("rm \\\n -rf y", "deny"),
    ("/bin/rm -rf y", "deny"),
    ("/usr/bin/rm -rf y", "deny"),
    ("/usr/local/bin/rm -rf y", "deny"),
    ("./rm -rf y", "deny?"),
    ("~/bin/rm -rf y", "deny?"),
    // Shells given code: `-c`, here-documents, here-strings.
    ("sh -c 'rm -rf y'", "deny"),
    ("bash -c \"rm -rf y\"", "deny"),
    ("dash -c 'rm -rf y'", "deny"),
    ("zsh -c 'rm -rf y'", "deny"),
    ("ksh -c 'rm -rf y'", "deny"),
    ("mksh -c 'rm -rf y'", "deny"),
    ("ash -c 'rm -rf y'", "deny"),
    ("yash -c 'rm -rf y'", "deny"),
    ("posh -c 'rm -rf y'", "deny"),
    ("fish -c 'rm -rf y'", "deny"),
    ("rbash -c 'rm -rf y'", "deny"),
    ("bash -lc 'rm -rf y'", "deny"),
    ("bash -e -c 'rm -rf y'", "deny"),
    ("bash -o pipefail -c 'rm -rf y'", "deny"),
    ("bash --norc -c 'rm -rf y'", "deny"),
    ("sh -c 'cd x; rm -rf y' sh", "deny"),
    ("/bin/sh -c 'rm -rf y'", "deny"),
    ("sh <<EOF\nrm -rf y\nEOF", "deny"),
    ("bash <<'EOF'\nrm -rf y\nEOF", "deny"),
    ("bash -s <<-EOF\n\trm -rf y\n\tEOF", "deny"),
    ("bash <<< 'rm -rf y'", "deny"),
    ("sh <<< \"rm -rf y\"", "deny"),
    // Shell builtins that run their arguments.
    ("eval 'rm -rf y'", "deny"),
    ("eval rm -rf y", "deny"),
    ("eval \"rm -rf y\"", "deny"),
    ("exec rm -rf y", "deny"),
    ("exec -a name rm -rf y", "deny"),
    ("command rm -rf y", "deny"),
    ("command -p rm -rf y", "deny"),
    ("builtin rm -rf y", "deny"),
    ("trap 'rm -rf y' EXIT", "deny"),
    // coreutils
    ("env rm -rf y", "deny"),
    ("env -i HOME=/ rm -rf y", "deny"),
    ("env -u HOME rm -rf y", "deny"),
    ("env -C /tmp rm -rf y", "deny"),
    ("env -- A=1 rm -rf y", "deny"),
    ("env -S 'rm -rf y'", "deny"),
    ("/usr/bin/env rm -rf y", "deny"),
    ("nice rm -rf y", "deny"),
    ("nice -n 10 rm -rf y", "deny"),
    ("nice -10 rm -rf y", "deny"),
    ("nice --adjustment=5 rm -rf y", "deny"),
    ("nohup rm -rf y", "deny"),
    ("timeout 5 rm -rf y", "deny"),
    ("timeout -s KILL 5 rm -rf y", "deny"),
    ("timeout --signal=KILL -k 1 5s rm -rf y", "deny"),
    ("stdbuf -oL rm -rf y", "deny"),
    ("stdbuf -o L -e 0 rm -rf y", "deny"),
    ("time rm -rf y", "deny"),
    ("time -p rm -rf y", "deny"),
    ("chroot / rm -rf y", "deny"),
    ("chroot --userspec=a:b / rm -rf y", "deny"),
    // findutils
    ("echo x | xargs rm", "deny"),
    ("echo x | xargs rm -rf", "deny"),
    ("xargs -0 rm < list", "deny"),
    ("xargs -n 1 -P 4 rm -rf < list", "deny"),
    ("xargs -I{} rm -rf {} < list", "deny"),
    ("xargs -a list rm", "deny"),
    ("find . -exec rm {} +", "deny"),
    ("find . -name '*.o' -exec rm -f {} \\;", "deny"),
    ("find . -execdir rm {} \\;", "deny"),
    ("find . -ok rm {} \\;", "deny"),
    ("find . -okdir rm {} ';'", "deny"),
    ("find . -print -exec echo {} \\; -exec rm -rf {} +", "deny"),
    // util-linux
    ("setsid rm -rf y", "deny"),
    ("setsid -f rm -rf y", "deny"),
    ("flock /tmp/l rm -rf y", "deny"),
    ("flock -w 5 /tmp/l rm -rf y", "deny"),
    ("flock /tmp/l -c 'rm -rf y'", "deny"),
    ("taskset 0x1 rm -rf y", "deny"),
    ("taskset -c 0,1 rm -rf y", "deny"),
    ("ionice -c 3 rm -rf y", "deny"),
    ("ionice -c2 -n7 rm -rf y", "deny"),
    ("chrt 10 rm -rf y", "deny"),
    ("chrt -f 10 rm -rf y", "deny"),
    ("prlimit --nofile=10 rm -rf y", "deny"),
    ("setpriv --reuid=1000 rm -rf y", "deny"),
    ("unshare -r rm -rf y", "deny"),
    ("unshare --mount --fork rm -rf y", "deny"),
    ("nsenter -t 1 -m rm -rf y", "deny"),
    ("runuser -u nobody -- rm -rf y", "deny"),
    ("runuser -u nobody rm -rf y", "deny"),
    ("runuser -l nobody -c 'rm -rf y'", "deny"),
    ("su -c 'rm -rf y' nobody", "deny"),
    ("su nobody -c 'rm -rf y'", "deny"),
    ("su - nobody -c 'rm -rf y'", "deny"),
    ("su --command='rm -rf y' nobody", "deny"),
    ("script -c 'rm -rf y' /dev/null", "deny"),
    ("script -q -c 'rm -rf y' log", "deny"),
    // Others
    ("sudo rm -rf y", "deny"),
    ("sudo -u root rm -rf y", "deny"),
    ("sudo -E HOME=/ rm -rf y", "deny"),
    ("sudo -s rm -rf y", "deny"),
    ("doas rm -rf y", "deny"),
    ("doas -u root rm -rf y", "deny"),
    ("pkexec rm -rf y", "deny"),
    ("sg wheel -c 'rm -rf y'", "deny"),
    ("watch rm -rf y", "deny"),
    ("watch -n 1 'rm -rf y'", "deny"),
    ("watch -x rm -rf y", "deny"),
    ("parallel rm ::: a b", "deny"),
    ("parallel -j 2 'rm -rf y' ::: a", "deny"),
    ("parallel -j 2 'rm -rf {}' ::: a", "deny?"),
    ("busybox rm -rf y", "deny"),
    ("busybox sh -c 'rm -rf y'", "deny"),
    ("strace -f rm -rf y", "deny"),
    ("ltrace rm -rf y", "deny"),
    // Two and three levels.
    ("sudo nice rm -rf y", "deny"),
    ("env nice nohup rm -rf y", "deny"),
    ("sh -c 'sudo rm -rf y'", "deny"),
    ("bash -c \"sh -c 'rm -rf y'\"", "deny"),
    ("sh -c \"bash -c \\\"eval 'rm -rf y'\\\"\"", "deny"),
    ("timeout 5 sudo -u x env rm -rf y", "deny"),
    ("find . -exec sh -c 'rm -rf \"$1\"' _ {} \\;", "deny"),
    ("xargs sh -c 'rm -rf y' < list", "deny"),
    ("echo x | xargs -I{} sh -c 'nice rm -rf y'", "deny"),
    ("nohup bash -c 'timeout 1 xargs rm < l'", "deny"),
    ("sudo sh <<EOF\nrm -rf y\nEOF", "deny"),
    ("eval \"$(echo) rm -rf y\"", "deny?"),
    ("f() { sh -c 'nice rm -rf y'; }; f", "deny"),
    ("( { echo $(sudo rm -rf y); } )", "deny"),
    ("watch 'flock l -c \"rm -rf y\"'", "deny"),
    // Not decidable: the strictest decision a Bash rule with a pattern gives.
    ("X=rm; $X -rf y", "deny?"),
    ("\"$X\" -rf y", "deny?"),
    ("${cmd} -rf y", "deny?"),
    ("\"$(echo rm)\" -rf y", "deny?"),
    ("`echo rm` -rf y", "deny?"),
    ("source ./x.sh", "deny?"),
    (". ./x.sh", "deny?"),
    ("eval \"$v\"", "deny?"),
    ("echo 'rm -rf y' | sh", "deny?"),
    ("curl -s x | bash", "deny?"),
    ("sh -c \"$CMD\"", "deny?"),
    ("bash script.sh", "deny?"),
    ("./deploy.sh", "deny?"),
    ("sh < script.sh", "deny?"),
    ("r* -rf y", "deny?"),
    ("{rm,-rf,y}", "deny?"),
    ("git -c alias.p=push p", "deny?"),
    ("git -c alias.p='!rm -rf y' p", "deny"),
    ("git -c core.pager='rm -rf y' log", "deny"),
    ("git -c core.sshCommand='sh -c \"rm -rf y\"' fetch", "deny"),
    ("git -c core.hooksPath=h commit", "deny?"),
    ("PATH=.:$PATH ls", "deny?"),
    ("export PATH=/tmp/x; ls", "deny?"),
    ("LD_PRELOAD=./x.so ls", "deny?"),
    ("BASH_ENV=./x bash -c ls", "deny?"),
    ("env PATH=. ls", "deny?"),
    ("echo 'rm -rf y' | xargs -I{} sh -c '{}'", "deny?"),
    ("find . -exec {} \\;", "deny?"),
    ("find . -exec sh -c 'echo {}' \\;", "deny?"),
    ("hash -p ./x ls; ls", "deny?"),
    ("coproc rm -rf y", "deny"),
    ("coproc NAME { rm -rf y; }", "deny?"),
    ("select x in a; do rm -rf y; done", "deny"),
    ("until false; do rm -rf y; done", "deny"),
    ("for ((i=0;i<1;i++)); do rm -rf y; done", "deny"),
    ("if [[ $(rm -rf y) ]]; then :; fi", "deny"),
    ("echo ${x:=$(rm -rf y)}", "deny"),
    ("echo ok > >(sh -c 'rm -rf y')", "deny"),
    ("while read l; do rm -rf \"$l\"; done < list", "deny"),
    ("bash -c 'rm -rf \"$1\"' _ y", "deny"),
    ("time -p nice rm -rf y", "deny"),
    ("xargs -0 -I % rm % < l", "deny"),
    ("rm\t-rf\ty", "deny"),
    ("\"$(which rm)\" -rf y", "deny?"),
    ("fakeroot rm -rf y", "deny"),
    ("unbuffer rm -rf y", "deny"),
    ("rm -rf $(", "deny?"),
    ("env $X -rf y", "deny?"),
    ("sudo \"$@\"", "deny?"),
    ("parallel < cmds", "deny?"),
    ("exec \"$SHELL\" -c x", "deny?"),
    ("nice ${RM:-rm} y", "deny?"),
    // Ask: `git push*` with git's global options dropped.
    ("git push origin main", "ask"),
    ("git -C repo push", "ask"),
    ("git -c user.name=x push", "ask"),
    ("git --git-dir=.git push", "ask"),
    ("git --git-dir .git --work-tree . push", "ask"),
    ("git --no-pager push", "ask"),
    ("git -P -C a -C b push --force", "ask"),
    ("cd repo && git push", "ask"),
    ("sh -c 'git -C repo push'", "ask"),
    ("/usr/bin/git push", "ask"),
    ("nice git push", "ask"),
    ("\"git\" 'push'", "ask"),
    ("git -C repo push; rm -rf y", "deny"),
    // What must stay allowed.
    ("echo rm", "allow"),
    ("grep -r \"rm -rf\" .", "allow"),
    ("git commit -m \"git push later\"", "allow"),
    ("echo 'rm -rf y'", "allow"),
    ("ls -la", "allow"),
    ("printf '%s\\n' \"rm -rf x\"", "allow"),
    ("git status", "allow"),
    ("git -C repo status", "allow"),
    ("git log --grep=\"git push\"", "allow"),
    ("find . -name '*.rs'", "allow"),
    ("find . -name rm", "allow"),
    ("xargs echo < list", "allow"),
    ("cat rm.txt", "allow"),
    ("man rm", "allow"),
    ("which rm", "allow"),
    ("command -v git", "allow"),
    ("echo \"sh -c 'rm -rf y'\"", "allow"),
    ("cargo build", "allow"),
    ("nice -n 5 cargo test", "allow"),
    ("X=1 cargo test", "allow"),
    ("env FOO=1 ls", "allow"),
    ("echo $HOME", "allow"),
    ("ls $(pwd)", "allow"),
    ("sudo -l", "allow"),
    ("timeout 5 ls", "allow"),
    ("sh -c 'ls -la'", "allow"),
    ("bash -c 'echo rm -rf y'", "allow"),
    ("rmdir x", "allow"),
    ("trm -rf x", "allow"),
    ("cat <<EOF\nrm -rf y\nEOF", "allow"),
    ("echo x > rm", "allow"),
    ("echo '$(rm -rf y)'", "allow"),
    ("echo \"\\$(rm -rf y)\"", "allow"),
    ("# rm -rf y", "allow"),
    ("ls # ; rm -rf y", "allow"),
    ("echo x | xargs -I{} echo {}", "allow"),
    ("python3 -c 'import shutil; shutil.rmtree(\"y\")'", "allow"),
    ("alias rm2=rm", "allow"),
    ("", "allow"),
];

#[test]
fn the_table_of_command_lines() {
    let policy = issue_policy();
    let mut wrong = Vec::new();
    for (line, expected) in TABLE {
        let verdict = policy.judge("Bash", Some(line));
        if show(&verdict) != *expected {
            wrong.push(format!(
                "{line:?}: expected {expected}, got {} ({:?}; commands {:?})",
                show(&verdict),
                verdict.undecidable,
                shell::analyse(line).commands
            ));
        }
    }
    assert!(TABLE.len() >= 150, "{} lines", TABLE.len());
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn every_listed_wrapper_is_in_the_table() {
    for wrapper in [
        "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "fish", "rbash", "eval",
        "exec", "command", "builtin", "trap", "source", ".", "env", "nice", "nohup", "timeout",
        "stdbuf", "chroot", "time", "xargs", "find", "setsid", "flock", "taskset", "ionice",
        "chrt", "prlimit", "setpriv", "unshare", "nsenter", "runuser", "su", "script", "sudo",
        "doas", "pkexec", "sg", "watch", "parallel", "busybox", "strace", "ltrace",
    ] {
        let denied = TABLE.iter().any(|(line, expected)| {
            expected.starts_with("deny") && line.split_whitespace().any(|w| w == wrapper)
        });
        assert!(denied, "no denied line goes through {wrapper}");
    }
}

#[test]
fn undecidable_lines_take_the_strictest_rule_and_say_why() {
    let line = "X=rm; $X -rf y";
    // Deny with a pattern: deny.
    let verdict = issue_policy().judge("Bash", Some(line));
    assert_eq!(verdict.decision, Decision::Deny);
    let why = verdict.undecidable.unwrap();
    assert!(why.contains("not a literal ($X)"), "{why}");
    assert!(why.contains("write the command literally"), "{why}");
    // Only ask with a pattern: ask.
    let ask = ToolPolicy {
        ask: rules(&["Bash(git push*)"]),
        ..ToolPolicy::default()
    };
    assert_eq!(ask.judge("Bash", Some(line)).decision, Decision::Ask);
    // An allow pattern cannot allow it: the default.
    let allow = ToolPolicy {
        allow: rules(&["Bash(ls*)"]),
        default: Decision::Ask,
        ..ToolPolicy::default()
    };
    let verdict = allow.judge("Bash", Some(line));
    assert_eq!(verdict.decision, Decision::Ask);
    assert!(verdict.undecidable.is_some());
    // No rule with a pattern: nothing to decide, nothing said.
    assert_eq!(
        ToolPolicy::default().judge("Bash", Some(line)),
        Verdict::decided(Decision::Allow)
    );
    let all = ToolPolicy {
        allow: rules(&["Bash"]),
        deny: rules(&["Read(/etc/*)"]),
        default: Decision::Deny,
        ..ToolPolicy::default()
    };
    assert_eq!(all.judge("Bash", Some(line)).decision, Decision::Allow);
}

#[test]
fn a_deny_pattern_with_a_path_meets_the_program_by_that_path() {
    let p = ToolPolicy {
        deny: rules(&["Bash(/usr/bin/rm *)"]),
        ..ToolPolicy::default()
    };
    assert_eq!(
        p.decide("Bash", Some("sudo /usr/bin/rm -rf y")),
        Decision::Deny
    );
    assert_eq!(p.decide("Bash", Some("sudo rm -rf y")), Decision::Allow);
}

#[test]
fn an_allow_pattern_covers_every_command_the_line_runs() {
    let p = ToolPolicy {
        allow: rules(&["Bash(git *)", "Bash(ls*)", "Bash(cargo *)"]),
        default: Decision::Deny,
        ..ToolPolicy::default()
    };
    for (line, expected) in [
        ("git status", Decision::Allow),
        ("ls && git -C x status", Decision::Allow),
        ("ls | cargo test", Decision::Allow),
        ("git status && rm x", Decision::Deny),
        ("git status $(rm x)", Decision::Deny),
        ("nice git status", Decision::Deny),
        ("sh -c 'git status'", Decision::Deny),
        ("X=git; $X status", Decision::Deny),
        ("f(){ rm x; }; git status", Decision::Deny),
    ] {
        assert_eq!(p.decide("Bash", Some(line)), expected, "{line:?}");
    }
}

/// Puts `code` in single quotes for the shell.
fn single_quoted(code: &str) -> String {
    format!("'{}'", code.replace('\'', "'\\''"))
}

/// Ways to run a simple command (`{}` stands for it): they keep it a simple command.
const PREFIXES: &[&str] = &[
    "nice {}",
    "nohup {}",
    "env -i A=1 {}",
    "sudo -u root {}",
    "timeout 5 {}",
    "stdbuf -oL {}",
    "setsid {}",
    "exec {}",
    "command {}",
    "time {}",
    "flock /tmp/l {}",
    "taskset 1 {}",
    "ionice -c3 {}",
    "unshare -r {}",
    "doas {}",
    "busybox {}",
    "xargs -a list {}",
    "find . -exec {} \\;",
    "chroot / {}",
    "strace -f {}",
    "setpriv --reuid=1 {}",
    "prlimit --nofile=1 {}",
    "nsenter -t 1 -m {}",
    "runuser -u x -- {}",
    "pkexec {}",
    "chrt 1 {}",
    "fakeroot {}",
    "sudo -s {}",
];

/// Ways to run any command line (`{}` stands for it, `{q}` for it single-quoted).
const NESTINGS: &[&str] = &[
    "sh -c {q}",
    "bash -lc {q}",
    "eval {q}",
    "su -c {q} nobody",
    "script -qc {q} /dev/null",
    "watch -n 1 {q}",
    "flock l -c {q}",
    "trap {q} EXIT",
    "env -S {q}",
    "sg wheel -c {q}",
    "bash <<< {q}",
    "parallel {q} ::: a",
    "({})",
    "{ {}; }",
    "true && {}",
    "false || {}",
    "ls | {}",
    "echo \"$({})\"",
    "f(){ {}; }; f",
    "if true; then {}; fi",
    "bash <<'EOF'\n{}\nEOF",
];

/// One supported way to run `inner` (a command line): wrapped, quoted or nested. A prefix
/// takes a simple command; `simple` says whether `inner` is one (else it goes to the prefix
/// through `sh -c`).
fn wrap(inner: &str, how: usize, simple: bool) -> String {
    let q = single_quoted(inner);
    let how = how % (PREFIXES.len() + NESTINGS.len());
    match PREFIXES.get(how) {
        Some(prefix) if simple => prefix.replace("{}", inner),
        Some(prefix) => prefix.replace("{}", &format!("sh -c {q}")),
        None => NESTINGS[how - PREFIXES.len()]
            .replace("{q}", &q)
            .replace("{}", inner),
    }
}

/// The denied command with its program quoted or named by a path.
fn spelled(how: usize, args: &str) -> String {
    let program = [
        "rm",
        "'rm'",
        "\"rm\"",
        "\\rm",
        "r''m",
        "/bin/rm",
        "$'rm'",
        "$'\\x72m'",
        "r\"m\"",
    ][how % 9];
    format!("{program} {args}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_denied_command_wrapped_quoted_or_nested_is_never_allowed(
        program in 0usize..9,
        args in prop::sample::select(vec!["-rf y", "x", "-f a b", "-rf /"]),
        ways in prop::collection::vec(0usize..(PREFIXES.len() + NESTINGS.len()), 0..4),
    ) {
        let mut line = spelled(program, args);
        let mut simple = true;
        for how in ways {
            line = wrap(&line, how, simple);
            simple &= how < PREFIXES.len();
        }
        let verdict = issue_policy().judge("Bash", Some(&line));
        prop_assert_ne!(verdict.decision, Decision::Allow, "{:?}", line);
    }

    #[test]
    fn the_parser_takes_any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let line = String::from_utf8_lossy(&bytes);
        let start = Instant::now();
        let _ = issue_policy().judge("Bash", Some(&line));
        prop_assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn the_parser_takes_any_shell_like_text(line in "[ a-z$(){}'\"`\\\\|&;<>!*\n=-]{0,400}") {
        let start = Instant::now();
        let _ = issue_policy().judge("Bash", Some(&line));
        prop_assert!(start.elapsed() < Duration::from_secs(1));
    }
}

#[test]
fn the_worst_inputs_are_undecidable_in_bounded_time() {
    let nested =
        |open: &str, close: &str, n: usize| format!("{}rm x{}", open.repeat(n), close.repeat(n));
    let cases = [
        ("a 1 MiB line", format!("rm {}", "a".repeat(1 << 20))),
        ("10,000 nested parentheses", nested("(", ")", 10_000)),
        (
            "3,000 nested parentheses, under the size limit",
            nested("(", ")", 3_000),
        ),
        (
            "2,000 nested substitutions, under the size limit",
            nested("$(", ")", 2_000),
        ),
        (
            "10,000 nested substitutions",
            nested("echo $(", ")", 10_000),
        ),
        ("10,000 nested groups", nested("{ ", "; }", 10_000)),
        ("10,000 quotes then rm", "\"".repeat(10_000) + "; rm x"),
        ("10,000 backslashes then rm", "\\".repeat(10_000) + "; rm x"),
        ("20,000 commands", "ls && ".repeat(20_000) + "rm x"),
        (
            "1,300 commands, under the size limit",
            "ls && ".repeat(1_300) + "rm x",
        ),
        ("40 nested wrappers", "nice ".repeat(40) + "rm x"),
        ("40 nested evals", "eval ".repeat(40) + "rm x"),
        ("10 nested shells", {
            let mut line = "rm -rf y".to_owned();
            for _ in 0..10 {
                line = format!("sh -c {}", single_quoted(&line));
            }
            line
        }),
    ];
    for (what, line) in cases {
        let start = Instant::now();
        let verdict = issue_policy().judge("Bash", Some(&line));
        let took = start.elapsed();
        assert!(took < Duration::from_secs(1), "{what}: {took:?}");
        assert_eq!(verdict.decision, Decision::Deny, "{what}");
    }
    let long = "a".repeat(1 << 20);
    assert!(issue_policy()
        .judge("Bash", Some(&long))
        .undecidable
        .is_some());
}
