#!/usr/bin/env bash
# Tests the man page generator tools/man/simba-man.cmake: generates simba.1 from the built
# simba, checks its structure, that it names every command `simba --help` lists and, in each
# command's subsection, every flag `simba COMMAND --help` prints (so the page cannot drift from
# the help), and that groff renders it without a warning and man(1) shows it (each when
# installed; the structure is checked either way).
#
#   man_page_test.sh path/to/simba path/to/cmake path/to/simba-man.cmake path/to/docs/cli.md
set -u

if (($# != 4)); then
  echo "usage: $0 SIMBA CMAKE GENERATOR CLI_DOC" >&2
  exit 2
fi
simba=$1
cmake=$2
generator=$3
cli_doc=$4
failures=0
checks=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
page=$tmp/simba.1

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
check() {  # check DESCRIPTION COMMAND...: COMMAND must succeed
  local what=$1
  shift
  checks=$((checks + 1))
  "$@" || fail "$what"
}

# ---- generate ----------------------------------------------------------------------------------

if ! "$cmake" -DSIMBA="$simba" -DOUTPUT="$page" -DCLI_DOC="$cli_doc" -P "$generator" \
  >"$tmp/gen.out" 2>"$tmp/gen.err"; then
  echo "FAIL: the generator failed:" >&2
  cat "$tmp/gen.out" "$tmp/gen.err" >&2
  exit 1
fi
check "the generator warned: $(cat "$tmp/gen.err")" test ! -s "$tmp/gen.err"
check "no page at $page" test -s "$page"

# ---- structure ---------------------------------------------------------------------------------

version=$("$simba" --version | sed 's/^simba //')
check ".TH does not name simba $version" grep -qE "^\.TH SIMBA 1 \"[0-9-]+\" \"simba $version\"" "$page"
# The sections, in this order.
sections=$(sed -n 's/^\.SH //p' "$page" | tr -d '"')
order=""
for section in NAME SYNOPSIS DESCRIPTION COMMANDS ENVIRONMENT "EXIT STATUS" "SEE ALSO"; do
  checks=$((checks + 1))
  grep -qxF "$section" <<<"$sections" || fail "no .SH $section"
  order+=$(grep -nxF "$section" <<<"$sections" | cut -d: -f1)" "
done
checks=$((checks + 1))
[[ $order == $(tr ' ' '\n' <<<"$order" | sed '/^$/d' | sort -n | tr '\n' ' ') ]] ||
  fail "sections out of order: $(tr '\n' ' ' <<<"$sections")"
check "NAME is not 'simba \\- ...'" grep -qE '^simba \\- [a-z]' "$page"
# Every roff request is one groff's man macros know (mandoc knows them too).
checks=$((checks + 1))
unknown=$(grep -oE '^\.[A-Za-z]+' "$page" | sort -u | grep -vxE '\.(TH|SH|SS|PP|TP|RS|RE|nf|fi|SY|YS|BR)')
[[ -z $unknown ]] || fail "unexpected requests: $unknown"

# The lines of one section (.SH) or subsection (.SS) of the page.
section_of() {  # section_of MACRO TITLE
  awk -v macro="$1" -v title="$2" '
    $1 == ".SH" || $1 == ".SS" { if (inside && ($1 == ".SH" || $1 == macro)) exit }
    inside { print }
    $0 == macro " " title || $0 == macro " \"" title "\"" { inside = 1 }' "$page"
}

top_help=$("$simba" --help)
list_items() { sed -n "/^$1:\$/,/^\$/p" | sed -n 's/^  \([^ ]\{1,\}\).*/\1/p'; }
mapfile -t commands < <(list_items commands <<<"$top_help")
((${#commands[@]} >= 6)) || fail "'simba --help' lists only these commands: ${commands[*]}"
synopsis=$(section_of .SH SYNOPSIS)
for command in "${commands[@]}"; do
  checks=$((checks + 2))
  subsection=$(section_of .SS "$command")
  [[ -n $subsection ]] || fail "no subsection '.SS $command' under COMMANDS"
  grep -qE "^\\\\fB$command\\\\fR" <<<"$synopsis" || fail "SYNOPSIS has no 'simba $command'"
  [[ $command == help ]] && continue
  help=$("$simba" "$command" --help) || {
    fail "'simba $command --help' failed"
    continue
  }
  # Each option of the help is a .TP item of the subsection, and every flag the help mentions
  # (outside its example) is in the subsection, as roff writes it (\-\-flag).
  while read -r flag; do
    checks=$((checks + 1))
    escaped=${flag//-/\\\\-}
    grep -qE "^\\\\fB$escaped\\\\fR" <<<"$(grep -A1 -x '\.TP' <<<"$subsection")" ||
      fail "'.SS $command' has no .TP item for $flag"
  done < <(list_items options <<<"$help" | grep -E '^--')
  while read -r flag; do
    checks=$((checks + 1))
    grep -qF -- "${flag//-/\\-}" <<<"$subsection" || fail "'.SS $command' does not mention $flag"
  done < <(sed '/^example/,$d' <<<"$help" | grep -oE -- '(^|[^[:alnum:]-])--[a-z][a-z-]*' |
    grep -oE -- '--[a-z-]+' | sort -u)
  # Its usage line is in SYNOPSIS and in the subsection.
  checks=$((checks + 1))
  grep -qx '\.SY simba' <<<"$subsection" || fail "'.SS $command' has no .SY synopsis"
  # The example is kept, unfilled.
  if grep -q '^example:' <<<"$help"; then
    checks=$((checks + 1))
    grep -qx '\.nf' <<<"$subsection" || fail "'.SS $command' has no example (.nf)"
  fi
done

environment=$(section_of .SH ENVIRONMENT)
while read -r variable; do
  checks=$((checks + 1))
  grep -qF "$variable" <<<"$environment" || fail "ENVIRONMENT does not name $variable"
done < <(list_items environment <<<"$top_help")
for variable in SIMBA_STORE SIMBA_LOG; do
  checks=$((checks + 1))
  grep -qF "$variable" <<<"$environment" || fail "ENVIRONMENT does not name $variable"
done

exit_status=$(section_of .SH "EXIT STATUS")
while read -r code; do
  checks=$((checks + 1))
  grep -qx "\\\\fB$code\\\\fR" <<<"$exit_status" || fail "EXIT STATUS has no item for $code"
done < <(sed -n '/^## Exit codes/,/^## /s/^| \([0-9][0-9]*\) |.*/\1/p' "$cli_doc")
for code in 0 64 69 75 76 126 127; do
  checks=$((checks + 1))
  grep -qx "\\\\fB$code\\\\fR" <<<"$exit_status" || fail "EXIT STATUS has no item for $code"
done

# ---- rendering ---------------------------------------------------------------------------------

if command -v groff >/dev/null; then
  checks=$((checks + 1))
  warnings=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
  [[ -z $warnings ]] || fail "groff warns:"$'\n'"$warnings"
  # As text, every flag reads as it is typed (--no-wait, not a dash or a hyphen).
  text=$(groff -man -Tascii -P-c -P-b -P-u "$page" 2>/dev/null)
  for command in "${commands[@]}"; do
    [[ $command == help ]] && continue
    while read -r flag; do
      checks=$((checks + 1))
      grep -qF -- "$flag" <<<"$text" || fail "the rendered page does not show $flag"
    done < <("$simba" "$command" --help | list_items options | grep -E '^--')
  done
else
  echo "groff is not installed: not rendering the page (structure checked)"
fi
if command -v man >/dev/null && command -v groff >/dev/null; then
  checks=$((checks + 1))
  shown=$(MANWIDTH=80 MANPAGER=cat PAGER=cat man -l "$page" 2>"$tmp/man.err")
  if ! grep -q 'EXIT STATUS' <<<"$shown" || [[ -s $tmp/man.err ]]; then
    fail "man -l does not show the page: $(cat "$tmp/man.err")"
  fi
fi

if ((failures > 0)); then
  echo "$failures of $checks checks failed (page: $page)" >&2
  exit 1
fi
echo "man page: $checks checks passed"
