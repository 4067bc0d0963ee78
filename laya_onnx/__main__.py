import sys

from laya_onnx.cli import main

sys.exit(main())
