#!/bin/bash
# Install tokamax and what it needs beyond a CUDA JAX image into a directory of its own, from wheels, for a
# machine without a package index. Fetch the wheels elsewhere first (Python 3.12, manylinux x86_64):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d WHEELS tokamax==0.0.17 einshape "pydantic>=2.11" pydantic-core annotated-types typing-inspection \
#       qwix immutabledict tensorboardx typing_extensions
# then, on the GPU machine:  source benchmarks/tokamax_site.sh WHEELS [SITE]   (SITE defaults to /tmp/tokamax-site)
# tokamax's benchmarking module imports xprof (a 32 MB wheel with many needs of its own) for its own profiler
# timing, which ragdot never calls: a stub module stands in for it, and raises if it is ever called.
wheels=${1:?usage: source benchmarks/tokamax_site.sh WHEELS [SITE]}
site=${2:-/tmp/tokamax-site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl \
    || { echo "tokamax_site: pip install failed" >&2; return 1 2>/dev/null || exit 1; }
mkdir -p "$site/xprof/cli"
: > "$site/xprof/__init__.py"
: > "$site/xprof/cli/__init__.py"
printf 'def get_kernel_stats_tool(*args, **kwargs):\n    raise RuntimeError("xprof is not installed here")\n' \
    > "$site/xprof/cli/tools.py"
export PYTHONPATH="$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH}"
