# The two set-up commands of README.md.  Both install into ./.venv first (idempotent).
.PHONY: serve test lint install install-test

install:
	bash launch/install.sh

install-test:
	bash launch/install.sh test

serve: install
	bash launch/serve_demo.sh

lint: install-test
	bash launch/lint.sh

test: lint
	bash launch/run_tests.sh
