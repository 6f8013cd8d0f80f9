# The two commands a newcomer needs (README): `make train` and `make test`. Both run scripts/setup first.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: setup build train test bench clean
setup:
	./scripts/setup

build: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

train: build
	./scripts/train_default

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

clean:
	rm -rf $(BUILD)
