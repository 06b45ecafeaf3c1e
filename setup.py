"""The one thing pyproject.toml cannot say: the Spark source's optional C read loop (spark_bridge/native.py).

optional=True: where it does not compile, the install goes on and the source reads with its Python loop.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pulsar_autoscale.spark_bridge._native_reader",
            ["spark_bridge/_native_reader.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
