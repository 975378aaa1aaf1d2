#!/usr/bin/env bash
# Installs what trident's build and tests need on Debian 12, and the Python
# environment .venv at the repository root (h5py, numpy, matplotlib, pytest,
# and the analysis package, editable). Safe to run again: when everything is
# there it checks and says nothing.
#
#   scripts/install-deps.sh            # build + test dependencies
#   scripts/install-deps.sh --slurm    # also slurm-wlm and munge (local test cluster)
#
# Environment: TRIDENT_PYTHON_BASE (python3 that creates .venv; default the
# python3 on PATH), TRIDENT_VENV (default <repo>/.venv).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
with_slurm=0
for a in "$@"; do
  case $a in
    --slurm) with_slurm=1 ;;
    -h | --help)
      sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install-deps.sh: unknown option '$a' (known: --slurm)" >&2
      exit 2
      ;;
  esac
done

say() { echo "install-deps.sh: $*" >&2; }

# ---- Debian packages ----
# (clang-format: Debian 12 has 14, the version the lint_format test checks with)
packages=(libopenmpi-dev openmpi-bin libucx-dev ucx-utils libhdf5-openmpi-dev hdf5-tools
  libtomlplusplus-dev catch2 libopenblas-dev libcli11-dev cmake ninja-build g++ ccache
  python3-venv pkg-config clang-format)
[[ $with_slurm -eq 1 ]] && packages+=(slurm-wlm munge)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [[ $status == ii* ]] || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo_cmd=(sudo -n)
    else
      say "missing Debian packages: ${missing[*]}"
      say "run this script as root, or: sudo apt-get install ${missing[*]}"
      exit 1
    fi
  else
    sudo_cmd=()
  fi
  say "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- Python virtual environment ----
venv=${TRIDENT_VENV:-$repo/.venv}
base_python=${TRIDENT_PYTHON_BASE:-$(command -v python3 || echo /usr/bin/python3)}
if [[ ! -x $venv/bin/python3 ]]; then
  say "creating $venv"
  "$base_python" -m venv "$venv"
fi
py=$venv/bin/python3
if ! "$py" -c 'import h5py, numpy, matplotlib, pytest' 2>/dev/null; then
  say "installing h5py numpy matplotlib pytest into $venv"
  "$py" -m pip install -q --disable-pip-version-check h5py numpy matplotlib pytest
fi

# The analysis package (wherever its pyproject.toml lives under share/trident),
# installed editable so that edits need no reinstall; reinstalled only when its
# pyproject.toml changes.
for pyproject in "$repo"/share/trident/pyproject.toml "$repo"/share/trident/*/pyproject.toml; do
  [[ -f $pyproject ]] || continue
  pkg_dir=$(dirname "$pyproject")
  stamp=$venv/.trident-$(basename "$pkg_dir").stamp
  sum=$(sha256sum "$pyproject" | cut -d' ' -f1)
  if [[ ! -f $stamp || $(cat "$stamp") != "$sum" ]]; then
    say "installing the analysis package from ${pkg_dir#"$repo"/} (editable)"
    "$py" -m pip install -q --disable-pip-version-check -e "$pkg_dir"
    echo "$sum" >"$stamp"
  fi
done
exit 0
