#!/bin/sh
# Removes from the runtime's Debian root file system what the agent runtime never uses (issue 43,
# D8: the `none` image at most 160 MB). Run inside the root being built, as root: by the
# Dockerfile's `base` stage (online path) and by mmdebstrap's customize hook (offline path,
# container/build.sh --offline), so both paths get the same base.
#
# Kept: bash, coreutils, git (with its https transport), ca-certificates, tzdata, dpkg and apt
# (so an image can be extended with apt-get), perl-base (dpkg's and debconf's scripts need it).
# Removed:
#   - git's Perl (perl, perl-modules, libperl: about 35 MB): only git's Perl commands use it
#     (send-email, svn, cvs, archimport, instaweb); `git add -i` is built in since git 2.26.
#     dpkg still records git's dependency on perl: `apt-get install` in a derived image asks for
#     `apt-get -f install` first, which brings Perl back (container/README.md).
#   - git's server and mail programs (daemon, shell, http-backend, http-push, imap-send, scalar,
#     gitweb): an agent clones, commits and pushes; it serves nothing.
#   - usrmerge and its Perl modules (the merge is done once the root exists).
#   - e2fsprogs (file system tools for block devices a container never has).
#   - glibc's gconv modules (character set conversions other than the built-in UTF-8, UTF-16/32,
#     ASCII and Latin-1).
#   - documentation (the copyright files stay), manuals, translations, apt's lists and caches,
#     debconf's backup templates, logs.
set -eu

dpkg --purge --force-depends perl perl-modules-5.36 libperl5.36 liberror-perl git-man \
  usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl \
  e2fsprogs logsave libext2fs2 libss2 2>&1 | grep -v '^(Reading database' || true

for f in git-daemon git-shell git-http-backend git-http-push git-imap-send scalar git-instaweb \
  git-send-email git-svn git-cvsserver git-cvsimport git-cvsexportcommit git-archimport \
  git-add--interactive git-request-pull; do
  rm -f "/usr/lib/git-core/$f" "/usr/bin/$f"
done
rm -rf /usr/share/gitweb /usr/share/git-core/templates/hooks/*.sample
rm -rf /usr/lib/x86_64-linux-gnu/gconv /usr/lib/aarch64-linux-gnu/gconv
find /usr/share/doc -mindepth 1 ! -name copyright ! -type d -delete 2>/dev/null || true
find /usr/share/doc -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf /usr/share/man/* /usr/share/info/* /usr/share/locale/* /usr/share/lintian \
  /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/log/*.log \
  /var/log/apt/* /var/cache/ldconfig/aux-cache
