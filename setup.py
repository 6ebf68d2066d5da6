from setuptools import find_packages, setup

setup(
    name="tbmq",
    version="0.1.0",
    description="An MQTT 3.1/3.1.1/5.0 broker on Twisted with TBMQ's design",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    packages=find_packages(include=["tbmq", "tbmq.*"]) + ["twisted.plugins", "tbmq_plugins"],
    package_dir={"tbmq_plugins": "plugins/tbmq_plugins", "": "."},
    package_data={"twisted": ["plugins/tbmq_plugin.py"]},
    data_files=[("etc/tbmq", ["etc/tbmq.yml"])],
    install_requires=[
        "twisted[tls]>=24.3",
        "zope.interface>=6",
        "pluggy>=1.5",
        "PyYAML>=6",
        "bcrypt>=4.1",
        "scramp>=1.4",
        "autobahn>=24.4",
    ],
    extras_require={
        "kafka": ["kafka-python>=2.0"],
        "redis": ["txredisapi>=1.4"],
        "postgres": ["psycopg2-binary>=2.9"],
        "analytics": ["pyspark>=3.5", "matplotlib>=3.7", "pyarrow>=14", "pandas>=2.0"],
        "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-twisted>=1.14", "hypothesis>=6.100",
                 "paho-mqtt>=2.1", "psycopg2-binary>=2.9",
                 "pyspark>=3.5", "matplotlib>=3.7", "pyarrow>=14", "pandas>=2.0"],
    },
    entry_points={
        "console_scripts": ["tbmq-analytics = tbmq.analytics.cli:main", "tbmq = tbmq.cli:main"],
        "tbmq": ["events = tbmq.events:plugin", "postgres = tbmq_plugins.postgres:plugin"],
    },
    classifiers=[
        "Framework :: Twisted",
        "Programming Language :: Python :: 3.11",
        "Topic :: Internet",
    ],
)
