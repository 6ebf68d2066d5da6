from setuptools import setup

setup(
    name="tbmq-example-plugin",
    version="0.1.0",
    description="An example third-party tbmq plugin: an audit file and a topic guard",
    py_modules=["tbmq_example_plugin"],
    install_requires=["tbmq"],
    entry_points={"tbmq": ["example = tbmq_example_plugin:plugin"]},
)
