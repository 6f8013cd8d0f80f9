# The two commands a newcomer needs (README): `make train` and `make test`. Both run scripts/setup first.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: setup configure build train test bench clean
setup:
	./scripts/setup

configure: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null

build: configure
	cmake --build $(BUILD) -j $(JOBS)

train: build
	./scripts/train_default

# What ctest runs (the mt_tests target: test executables, the binary, the fuzz targets), not the benchmarks.
test: configure
	cmake --build $(BUILD) -j $(JOBS) --target mt_tests
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

# Every benchmark (bench/); README "Benchmarks" says how to run each.
bench: build

clean:
	rm -rf $(BUILD)
