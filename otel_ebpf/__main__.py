import sys

from otel_ebpf.cli import main

sys.exit(main())
