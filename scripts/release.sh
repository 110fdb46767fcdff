#!/usr/bin/env bash
# `make release`: cut version bulk_recorder.__version__ from a clean checkout of a commit.
#
#   scripts/release.sh             # check, build the sdist, the wheel and the image, then tag
#   scripts/release.sh --dry-run   # every step but the tag (tests/integration/test_release.py)
#   scripts/release.sh --no-image  # skip the image (no podman here); never for a real release
#
# Steps, each stopping the release with one line saying why:
#  1. the tree is clean (nothing to commit, nothing untracked outside .gitignore);
#  2. the version is new: no tag v<version> yet, and greater than every v* tag;
#  3. CHANGELOG.md has a "## [<version>]" section;
#  4. the sdist and the wheel are built into dist/ (uv build; setup.py stamps the revision);
#  5. the wheel installs in a fresh virtualenv with the locked dependencies, its record rules
#     are the compiled ones, and `bulk-recorder --version` there names this version and commit;
#  6. the image is built (podman, --format docker) and tagged bulk-recorder:<version> and
#     bulk-recorder:<version>-<revision>, labelled with both (the migrate Job of an overlay is
#     named after the tag it runs: deploy the -<revision> tag and a rebuild gets a new Job);
#  7. the annotated tag v<version> is made (not pushed: `git push origin v<version>`).
set -euo pipefail
cd "$(dirname "$0")/.."
dry_run=0 image=1
for arg in "$@"; do
  case $arg in
    --dry-run) dry_run=1 ;;
    --no-image) image=0 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "release: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "release: $*" >&2; exit 1; }
python=${PYTHON:-.venv/bin/python}
uv=${UV:-.venv/bin/uv}
[[ -x $python && -x $uv ]] || fail "no $python or $uv: run make install first"

version=$("$python" -c 'import bulk_recorder; print(bulk_recorder.__version__)')
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "version $version is not MAJOR.MINOR.PATCH"
[[ -z $(git status --porcelain) ]] || fail "the tree is not clean: commit or remove what git status shows"
revision=$(git rev-parse HEAD)
git rev-parse -q --verify "refs/tags/v$version" >/dev/null && fail "v$version is already tagged: raise the version first"
newest=$(git tag --list 'v[0-9]*' | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | sed 's/^v//' | sort -V | tail -n 1 || true)
if [[ -n $newest && $(printf '%s\n%s\n' "$newest" "$version" | sort -V | tail -n 1) != "$version" ]]; then
  fail "version $version is not newer than the last release v$newest"
fi
grep -q "^## \[$version\]" CHANGELOG.md || fail "CHANGELOG.md has no '## [$version]' section"
echo "release: bulk-recorder $version at $revision"

rm -rf dist
BULK_RECORDER_REVISION=$revision "$uv" build --quiet --sdist --wheel --out-dir dist .
wheel=$(ls dist/bulk_recorder-"$version"-*.whl)
ls dist/bulk_recorder-"$version".tar.gz >/dev/null
echo "release: built $(cd dist && ls | tr '\n' ' ')"

venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"$uv" venv --quiet --python "$python" "$venv"
"$uv" pip install --quiet --python "$venv/bin/python" --require-hashes -r requirements.lock
"$uv" pip install --quiet --python "$venv/bin/python" --no-deps "$wheel"
shown=$("$venv/bin/bulk-recorder" --version)
[[ $shown == "bulk-recorder $version (revision $revision)" ]] || fail "the wheel says '$shown'"
(cd "$venv" && bin/python -c '
import importlib, sys
for name in ("validation", "rules", "documents", "exact"):
    module = importlib.import_module("bulk_recorder.records." + name)
    if not module.__file__.endswith(".so"):
        sys.exit(f"release: the wheel'"'"'s {name} is not compiled ({module.__file__})")
') || exit 1
echo "release: the wheel installs, compiled, and says: $shown"

if ((image)); then
  short=${revision:0:12}
  podman build --quiet --pull=never --format docker \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
    --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --tag "bulk-recorder:$version" --tag "bulk-recorder:$version-$short" . >/dev/null
  echo "release: image bulk-recorder:$version and bulk-recorder:$version-$short"
fi

if ((dry_run)); then
  echo "release: dry run, not tagged"
else
  git tag -a "v$version" -m "bulk-recorder $version" "$revision"
  echo "release: tagged v$version (push it: git push origin v$version)"
fi
