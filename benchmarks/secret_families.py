"""Build tests/data/secret-families.jsonl: the secret families issue 29 found slipping through,
as public rule sets give them, to measure cybmem's redaction on cases it was not written from.

    python benchmarks/secret_families.py           # rewrites tests/data/secret-families.jsonl
    python benchmarks/secret_families.py --check   # exit 1 when the file is not what this gives

Each case comes from a public rule set's own examples: Kingfisher's rules (mongodb/kingfisher,
data/rules/*.yml, ``examples``, Apache-2.0), gitleaks' rules (gitleaks/gitleaks,
cmd/generate/config/rules/*.go, ``tps``, MIT), detect-secrets' plugin tests (Yelp/detect-secrets,
tests/plugins/*_test.py, Apache-2.0), and for shapes no rule set carries an example of, the
specification's own example (RFC 6265 for cookies, PostgreSQL's .pgpass format, Oracle's JDBC
thin URL); round 5 adds the test inputs of Microsoft's sarif-pattern-matcher (SEC101 connection-string
rules, MIT) and secretlint's database-connection-string rule (MIT), Nosey Parker's MongoDB rule, and
proselint's security.password check (BSD-3-Clause). ``form`` says how: ``literal`` is the example as written; a named form (``prose``,
``shell``, ``wrapped``, ``json-escaped``, ``kubeconfig``, ``url``, ``ini``) puts the example's own
secret into that shape, with the source's other parts (user, host) where it has them.

``split`` is drawn from the rule id (crc32, even: dev; odd: held-out) before any case was scored:
the dev part is the one looked at while writing rules, the held-out part is only scored
(benchmarks/bench_secrets.py prints both).
"""

from __future__ import annotations

import base64
import json
import sys
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "secret-families.jsonl"

KF = {"repo": "mongodb/kingfisher", "commit": "339780329b871a5bbba39f9ef949eecab474c846", "licence": "Apache-2.0"}
GL = {"repo": "gitleaks/gitleaks", "licence": "MIT"}
DS = {"repo": "Yelp/detect-secrets", "licence": "Apache-2.0"}
RFC6265 = {"repo": "IETF RFC 6265", "path": "section 3.1 (examples)", "commit": None, "licence": "IETF Trust"}
PGPASS = {"repo": "PostgreSQL documentation", "path": "libpq-pgpass.html (the file's format)", "commit": None,
          "licence": "PostgreSQL"}
ORACLE = {"repo": "Oracle JDBC Developer's Guide", "path": "data-sources-and-URLs (thin driver URL)", "commit": None,
          "licence": "documentation"}

CASES: list[dict] = []


def case(family: str, source: dict, path: str | None, rule: str, text: str, value: str | None, form: str = "literal",
         split: str | None = None) -> None:
    CASES.append({"family": family, "text": text, "value": value, "form": form, "rule": rule,
                  **source, **({"path": path} if path else {}), **({"split": split} if split else {})})


# -- provider tokens without a label (Kingfisher's own examples, as written) ------------------------
K = "data/rules/{}.yml"
case("unlabelled", KF, K.format("github"), "kingfisher.github.1",
     "## git developer settings\n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\n", "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")
case("unlabelled", KF, K.format("github"), "kingfisher.github.1",
     "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",
     "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")
case("unlabelled", KF, K.format("github"), "kingfisher.github.7",
     "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",
     "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")
case("unlabelled", KF, K.format("github"), "kingfisher.github.3",
     "Example usage:\ngit clone http://ghs_RguXIkihJjwHAP6eXEYxaPNvywurTr5IOAbg@github.com/username/repo.git\n",
     "ghs_RguXIkihJjwHAP6eXEYxaPNvywurTr5IOAbg")
case("unlabelled", KF, K.format("slack"), "kingfisher.slack.1",
     "xapp-1-A05V64V7F2B-5062360157732-9f01726eebe77df2c096a65e95acdd02107b2c1e92ca341cff27ca271b7251b4",
     "9f01726eebe77df2c096a65e95acdd02107b2c1e92ca341cff27ca271b7251b4")
case("unlabelled", KF, K.format("slack"), "kingfisher.slack.2",
     "xoxb-853BAAEE-1B2eDb6A4c75-01bB6Da1CE3E98f6fED5AeC07Dc3E94C", "01bB6Da1CE3E98f6fED5AeC07Dc3E94C")
case("unlabelled", KF, K.format("slack"), "kingfisher.slack.2",
     "xoxe-1-My0xLTIxNTE3NzA2MDYtNzE5MDc2ODQ3OTg3Ny03MjE2NDY0MzYxNDcyLTliOWNhYzZhODU3ODc3NjAxZGM4ODg2ZWRkMmE2MTc3ZDA3ODY4ZmUzZDg2NzEyZTU0Zjk2ZTYzMWMxZTVmOTA",
     "My0xLTIxNTE3NzA2MDYtNzE5MDc2ODQ3OTg3Ny03MjE2NDY0MzYxNDcy")
case("unlabelled", KF, K.format("slack"), "kingfisher.slack.4",
     "https://hooks.slack.com/services/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", "CdVQm6KZiMPRxAqiIraNkYBW")
case("unlabelled", KF, K.format("mongodb"), "kingfisher.mongodb.4",
     "mdb_sa_sk_BdIX_jLzut2WTgglKzKvSgWMDDj5hEoTqdwOyLOL", "BdIX_jLzut2WTgglKzKvSgWMDDj5hEoTqdwOyLOL")
case("unlabelled", KF, K.format("anthropic"), "kingfisher.anthropic.1",
     "sk-ant-api668-Clm512odot9WDD7itfUU9R880nefA1EtYZDbpE-C9b0XQEWpqFKf9DQUo03vOfXl16oSmyar1CLF1SzV3YzpZJ6bahcpLAA",
     "Clm512odot9WDD7itfUU9R880nefA1EtYZDbpE")
case("unlabelled", KF, K.format("stripe"), "kingfisher.stripe.1", "sk_live_HQS0j4H75XpthOW", "sk_live_HQS0j4H75XpthOW")
case("unlabelled", KF, K.format("stripe"), "kingfisher.stripe.2",
     "sk_live_f01c79xuuug7yodgzj5ws0h1x2kyvho3ft3640n241uqewmael0e66iw91hrob9rl9pt6o",
     "sk_live_f01c79xuuug7yodgzj5ws0h1x2kyvho3ft3640n241uqewmael0e66iw91hrob9rl9pt6o")
case("unlabelled", KF, K.format("gitlab"), "kingfisher.gitlab.1", "glpat-kSaPeOD_-T0JxMi3p28B", "glpat-kSaPeOD_-T0JxMi3p28B")
case("unlabelled", KF, K.format("gitlab"), "kingfisher.gitlab.3",
     "curl    \\\n-X POST \\\n--fail  \\\n--no-progress-meter \\\n-F token=glptt-0d66598d696a02da33fb65e2a041f607c68ea50d \\\n-F ref=main\n",
     "glptt-0d66598d696a02da33fb65e2a041f607c68ea50d")
case("unlabelled", KF, K.format("jwt"), "kingfisher.jwt.1",
     "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJsb2dnZWRJbkFzIjoiYWRtaW4iLCJpYXQiOjE0MjI3Nzk2Mzh9.gzSraSYS8EXBxLN_oWnFSRgCzcmEmMjLiuyu5CSpyHI",
     "gzSraSYS8EXBxLN_oWnFSRgCzcmEmMjLiuyu5CSpyHI")
case("unlabelled", KF, K.format("aws"), "kingfisher.aws.1", "ASIAOZW6VBVAZFJHJLQA", "ASIAOZW6VBVAZFJHJLQA")

# -- snake_case and dotted keys in INI, env and properties files -------------------------------------
case("ini-env", KF, K.format("aws"), "kingfisher.aws.2",
     "foo.backup.archive.aws.secretkey=sBmHlDFrNcsz35N+LRjwlUxF8/wypT4tiJCQ0wP4", "sBmHlDFrNcsz35N+LRjwlUxF8/wypT4tiJCQ0wP4")
case("ini-env", KF, K.format("aws"), "kingfisher.aws.4",
     'export AWS_ACCESS_KEY_ID="I08BCX2ACV45ED1DOC9J"\nexport AWS_SECRET_ACCESS_KEY="0qk+o7XctJMmG6ydO8537c9+TofLJU1K0PiVBXSg"\n',
     "0qk+o7XctJMmG6ydO8537c9+TofLJU1K0PiVBXSg")
case("ini-env", KF, K.format("aws"), "kingfisher.aws.4",
     "[default]\naws_access_key_id = I08BCX2ACV45ED1DOC9J\naws_secret_access_key = 0qk+o7XctJMmG6ydO8537c9+TofLJU1K0PiVBXSg\n",
     "0qk+o7XctJMmG6ydO8537c9+TofLJU1K0PiVBXSg", "ini")
case("ini-env", KF, K.format("mongodb"), "kingfisher.mongodb.1",
     "ATLAS_PRIVATE_KEY=4b18315e-6b7d-4337-b449-5d38f5a189ec", "4b18315e-6b7d-4337-b449-5d38f5a189ec")
case("ini-env", KF, K.format("github"), "kingfisher.github.6",
     "GITHUB_CLIENT_ID=ac58d6da7d7a84c039b7\nGITHUB_SECRET=37d02377a3e9d849e18704c3ec883f9c5787d857\n",
     "37d02377a3e9d849e18704c3ec883f9c5787d857")
case("ini-env", KF, K.format("github"), "kingfisher.github.6",
     "[github]\nclient_id = ac58d6da7d7a84c039b7\nclient_secret = 37d02377a3e9d849e18704c3ec883f9c5787d857\n",
     "37d02377a3e9d849e18704c3ec883f9c5787d857", "ini")
case("ini-env", KF, K.format("generic"), "kingfisher.generic.4", "user = Aladdin\npassword = open_sesame\n", "open_sesame")
case("ini-env", KF, K.format("generic"), "kingfisher.generic.1",
     '    private static String CLIENT_SECRET = "6fb1cff7690db9ac066cadbbde8e3c078efdabcf";',
     "6fb1cff7690db9ac066cadbbde8e3c078efdabcf")
case("ini-env", KF, K.format("generic"), "kingfisher.generic.2", 'API_KEY = "951bc382db9abad29c68634761dd6e19"',
     "951bc382db9abad29c68634761dd6e19")
case("ini-env", KF, K.format("generic"), "kingfisher.generic.5", 'my_password: "super$ecret"', "super$ecret")
case("ini-env", KF, K.format("generic"), "kingfisher.generic.5", 'my_password := "super$ecret"', "super$ecret")
case("ini-env", KF, K.format("generic"), "kingfisher.generic.5",
     "[mysqld]\nroot_pw = super$ecret\n", "super$ecret", "ini")
case("ini-env", KF, K.format("generic"), "kingfisher.generic.8",
     "hostname = '10.11.12.13'\nUSERNAME = 'donjuandemarco@example.com'\n# some comment\n# some other comment\nPASS = '`123QWERasdf'\n",
     "`123QWERasdf")
case("ini-env", KF, K.format("generic"), "kingfisher.generic.3",
     "credential = UsernamePasswordCredential(\n    client_id='da34859b-2ae4-48c3-bfe0-1b28b7cf2eed',\n"
     "    username='donjuandemarco',\n    password='1qay@WXS????',\n    tenant_id='bc877b20-f135-4c13-a266-8ed26b8f0f4b')\n",
     "1qay@WXS????")

# -- JDBC, ODBC and other user/password@host strings -------------------------------------------------
case("connection-string", KF, K.format("odbc"), "kingfisher.odbc.1",
     "Server=host;Port=5432;User Id=username;Password=secret;Database=databasename;", None)
case("connection-string", KF, K.format("odbc"), "kingfisher.odbc.1",
     "Provider=SQLNCLI;Server=myServerName,myPortNumber;Database=myDataBase;Uid=myUsername;Pwd=myPassword;", None)
case("connection-string", KF, K.format("odbc"), "kingfisher.odbc.1",
     'adoConn.Open("Provider=SQLOLEDB.1;User ID=specialbill_user; " & "Password =specialbill_user;Initial Catalog=SpecialBill_PROD;Data Source=uszdba01;")',
     None)
case("connection-string", KF, K.format("odbc"), "kingfisher.odbc.1",
     '//Database Info\n$host = "localhost";\n$database = "NHOHVA";\n$user = "mg1021"; $password = "goodspec";\n', "goodspec")
case("connection-string", ORACLE, None, "jdbc-oracle-thin", "jdbc:oracle:thin:scott/tiger@myhost:1521:orcl", "tiger")
case("connection-string", ORACLE, None, "jdbc-oracle-thin",
     'String url = "jdbc:oracle:thin:donjuandemarco/`123QWERasdf@//10.11.12.13:1521/orcl";', "`123QWERasdf", "jdbc")
case("connection-string", KF, K.format("generic"), "kingfisher.generic.3",
     "sqlplus abuser/abuser123456@10.11.12.13:1521/ORCL", "abuser123456", "oracle-cli")
case("connection-string", KF, K.format("generic"), "kingfisher.generic.8",
     "expdp donjuandemarco/1qayWXS42@//10.11.12.13:1521/XE directory=dump", "1qayWXS42", "oracle-cli")

# -- URLs whose password holds an unencoded # or ?, and the URL rules' own examples -------------------
case("url", KF, K.format("postgres"), "kingfisher.postgres.1",
     'CONNECTION_URI="postgres://postgres:s2Tf2k@rLMy@google.com:5434/elephant"', "s2Tf2k@rLMy")
case("url", KF, K.format("postgres"), "kingfisher.postgres.1",
     "Connection URI= postgresql://nimda:vg498hwegw1udp6s@db-postgresql-nyc1-64297-do-user-1243723-0.db.ondigitalocean.com:25060/defaultdb?sslmode=require",
     "vg498hwegw1udp6s")
case("url", KF, K.format("mongodb"), "kingfisher.mongodb.3",
     'client = mongoc_client_new ("mongodb+srv://someuser:hunter2@my-atlas-rd941.mongodb.net/test?retryWrites=true&w=majority");',
     "hunter2")
case("url", KF, K.format("mongodb"), "kingfisher.mongodb.3", '"mongodb+srv://user:passw0rd@cluster0.something.mongodb.net/"',
     "passw0rd")
case("url", KF, K.format("uri"), "kingfisher.uri.1", "https://username:secret@example.com/path", None)
case("url", KF, K.format("generic"), "kingfisher.generic.3",
     "DATABASE_URL=postgres://donjuandemarco:1qay@WXS????@10.11.12.13:5432/app", "1qay@WXS????", "url")
case("url", KF, K.format("generic"), "kingfisher.generic.5",
     "redis://default:Pass123!@#@10.11.12.13:6379/0", "Pass123!@#", "url")
case("url", KF, K.format("generic"), "kingfisher.generic.8",
     "amqp://donjuandemarco:`123QWER#asdf@10.11.12.13:5672/vhost", None, "url")

# -- a .pgpass line written by a shell command ---------------------------------------------------------
case("pgpass-shell", PGPASS, None, "pgpass",
     'echo "10.11.12.13:5432:*:abuser:abuser123456" >> ~/.pgpass && chmod 600 ~/.pgpass', "abuser123456", "shell")
case("pgpass-shell", PGPASS, None, "pgpass",
     "RUN printf '%s\\n' 'db.internal:5432:app:donjuandemarco:1qayWXS42' > /root/.pgpass", "1qayWXS42", "shell")
case("pgpass-shell", KF, K.format("generic"), "kingfisher.generic.5",
     "echo '*:*:*:postgres:super$ecret' | tee $HOME/.pgpass", "super$ecret", "shell")

# -- a password stated in prose -------------------------------------------------------------------------
case("prose", KF, K.format("generic"), "kingfisher.weak_password.1", "The admin password is p@ssw0rd99 until we rotate it.",
     "p@ssw0rd99", "prose")
case("prose", KF, K.format("generic"), "kingfisher.weak_password.1", "staging db: the password was set to letmein42", "letmein42", "prose")
case("prose", KF, K.format("generic"), "kingfisher.generic.5", "Log in as root; the password is super$ecret", "super$ecret", "prose")
case("prose", KF, K.format("generic"), "kingfisher.generic.5", "vm_password? It is 'Pass123!@#' for now", None, "prose")
case("prose", KF, K.format("generic"), "kingfisher.generic.3", "Use password `123QWERasdf for the VPN.", "`123QWERasdf", "prose")
case("prose", KF, K.format("generic"), "kingfisher.generic.4", "the passphrase is open_sesame", None, "prose")
case("prose", GL, "cmd/generate/config/rules/generic.go", "generic-api-key",
     "our jenkins pw is 8ae31cacf141669ddfb5da", "8ae31cacf141669ddfb5da", "prose")

# -- session cookies ----------------------------------------------------------------------------------
case("cookie", RFC6265, None, "rfc6265-3.1", "Set-Cookie: SID=31d4d96e407aad42", "31d4d96e407aad42")
case("cookie", RFC6265, None, "rfc6265-3.1", "Set-Cookie: SID=31d4d96e407aad42; Path=/; Domain=example.com", "31d4d96e407aad42")
case("cookie", RFC6265, None, "rfc6265-3.1", "Cookie: SID=31d4d96e407aad42; lang=en-US", "31d4d96e407aad42")
case("cookie", RFC6265, None, "rfc6265-3.1",
     "Set-Cookie: SID=31d4d96e407aad42; Path=/; Secure; HttpOnly\nSet-Cookie: lang=en-US; Path=/; Domain=example.com",
     "31d4d96e407aad42")
case("cookie", RFC6265, None, "rfc6265-3.1", "curl -b 'SID=31d4d96e407aad42' https://example.com/", "31d4d96e407aad42", "curl")
case("cookie", {**GL, "commit": "2c097d4b318b14006be3698115387490051cd1e8"}, "cmd/generate/config/rules/gitlab.go",
     "gitlab-session-cookie", "Cookie: _gitlab_session=kq2v5m1w8x3c7z9b4n6d0f2h5j8l1p3r", "kq2v5m1w8x3c7z9b4n6d0f2h5j8l1p3r", "header")
case("cookie", RFC6265, None, "rfc6265-3.1",
     "# Netscape HTTP Cookie File\nexample.com\tFALSE\t/\tTRUE\t0\tSID\t31d4d96e407aad42\n", "31d4d96e407aad42", "cookie-jar")

# -- base64 key material as kubeconfig and Kubernetes hold it -----------------------------------------
_PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8QuKUpRKfFLfRYC9AIKjbJTWit+CqvjWYzvQwECAwEAAQJAIJLixBy2qpFoS4DSmoEmo3qGy0t6z09AIJtH+5OeRV1be+N4cDYJKffGzDa88vQENZiRm0GRq6a+HPGQMd2kTQIhAKMSvzIBnni7ot/OSie2TmJLY4SwTQAevXysE2RbFDYdAiEBCUEaRQnMnbp79mxDXDf6AU0cN/RPBjb9qSHDcWZHGzUCIG2Es59z8ugGrDY+pxLQnwfotadxd+Uyv/Ow5T0q5gIJAiEAyS4RaI9YG8EWx/2w0T67ZUVAw8eOMB6BIUg0Xcu+3okCIBOs/5OiPgoTdSy7bcF9IGpSE8ZgGKzgYQVZeN97Y==\n-----END RSA PRIVATE KEY-----\n")
_PEM64 = base64.b64encode(_PEM.encode()).decode()
_GLPK = {**GL, "commit": "00639b2ad719a17dab59de304b839b4a30ab05e3"}
case("kubeconfig", _GLPK, "cmd/generate/config/rules/privatekey.go", "private-key",
     "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user:\n    client-certificate-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t\n"
     f"    client-key-data: {_PEM64}\n", _PEM64[20:80], "kubeconfig")
case("kubeconfig", _GLPK, "cmd/generate/config/rules/privatekey.go", "private-key",
     f'{{"kind": "Config", "users": [{{"name": "admin", "user": {{"client-key-data": "{_PEM64}"}}}}]}}', _PEM64[20:80],
     "kubeconfig-json")
case("kubeconfig", _GLPK, "cmd/generate/config/rules/privatekey.go", "private-key",
     f"apiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\ndata:\n  tls.crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t\n  tls.key: {_PEM64}\n",
     _PEM64[20:80], "kubernetes-tls")
case("kubeconfig", _GLPK, "cmd/generate/config/rules/privatekey.go", "private-key",
     f"ssh_key_b64={_PEM64}", _PEM64[20:80], "base64")
_GLK = {**GL, "commit": "1592c1c7987a8d86f4d036e5a8e007c31f409cc3"}
case("kubeconfig", _GLK, "cmd/generate/config/rules/kubernetes.go", "kubernetes-secret-yaml",
     '{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db-user-pass"}, "type": "Opaque", '
     '"data": {"password": "UyFCXCpkJHpEc2I9", "username": "YWRtaW4="}}', "UyFCXCpkJHpEc2I9", "json")

# -- tokens wrapped over lines or escaped inside JSON ----------------------------------------------------
case("wrapped-escaped", KF, K.format("aws"), "kingfisher.aws.2",
     '"\\"awsSecretKey\\":\\"3lyTWqHMt5UySny2drdPYheRTEzrNux8Cn5JWFHL\\",\" +', "3lyTWqHMt5UySny2drdPYheRTEzrNux8Cn5JWFHL")
case("wrapped-escaped", KF, K.format("gitlab"), "kingfisher.gitlab.1",
     "docker build -t tweedledee \\\n-f Dockerfile \\\n--build-arg 'GO_REPO_TOKEN=glpat-tFrjFXD7soVU2fqxuDMh' \\\n",
     "glpat-tFrjFXD7soVU2fqxuDMh")
case("wrapped-escaped", KF, K.format("gitlab"), "kingfisher.gitlab.2",
     'sudo gitlab-runner register \\\n--non-interactive \\\n--url "https://gitlab.com/" \\\n'
     '--registration-token "GR1348941_iAgdMy7a3NhZaa5oNoH" \\\n--executor "docker"\n', "GR1348941_iAgdMy7a3NhZaa5oNoH")
case("wrapped-escaped", KF, K.format("github"), "kingfisher.github.1",
     "token:\n  ghp_XIxB7KMNdAr3zqWtQq\n  hE94qglHqOzn1D1stg\n", "hE94qglHqOzn1D1stg", "wrapped")
case("wrapped-escaped", KF, K.format("github"), "kingfisher.github.1",
     "export GITHUB_KEY=ghp_4U3LSowpDx8XvYE7A8\\\nGH56oxU5aWnY2mzIbV\n", "GH56oxU5aWnY2mzIbV", "wrapped")
case("wrapped-escaped", KF, K.format("github"), "kingfisher.github.3",
     '{"config": "{\\"token\\": \\"ghu_16C7e42F292c69C2E7C10c838347Ae178B4a\\"}"}', "ghu_16C7e42F292c69C2E7C10c838347Ae178B4a",
     "json-escaped")
case("wrapped-escaped", KF, K.format("github"), "kingfisher.github.4",
     '{"refresh_token": "ghr_1B4a2e77838347a7E420ce178F2E7c6912E1\\n69246c3CE1ccbF66C46812d16D5B1A9Dc86A1498"}',
     "69246c3CE1ccbF66C46812d16D5B1A9Dc86A1498", "json-escaped")
case("wrapped-escaped", KF, K.format("slack"), "kingfisher.slack.2",
     'const token = "xoxb-853BAAEE-1B2eDb6A4c75-" +\n    "01bB6Da1CE3E98f6fED5AeC07Dc3E94C";', "01bB6Da1CE3E98f6fED5AeC07Dc3E94C", "wrapped")
case("wrapped-escaped", KF, K.format("stripe"), "kingfisher.stripe.2",
     '{"key": "sk_live_f01c79xuuug7yodgzj5ws0h1x2\\u006byvho3ft3640n241uqewmael0e66iw91hrob9rl9pt6o"}',
     "yvho3ft3640n241uqewmael0e66iw91hrob9rl9pt6o", "json-escaped")


# -- round 4: more of the weakest families (connection strings, config keys, prose) ----------------
# Every example of the files below that states a credential of these families is taken as written,
# except one whose secret is a documented stand-in (secret, password, pass, myPassword, ddd, ######,
# $VAR, #{...}), one the source marks allowlisted, and one already above; ``value`` is None only
# where the secret also spells another part of the text (a user name holding it).
NP = {"repo": "praetorian-inc/noseyparker", "licence": "Apache-2.0"}
NPR = "crates/noseyparker/data/default/builtin/rules/{}.yml"
KFR = {"repo": "rgmz/kingfisher", "licence": "Apache-2.0"}  # a fork of mongodb/kingfisher with newer rules
GHAS = {"repo": "advanced-security/secret-scanning-custom-patterns", "licence": "MIT"}
_GLG = {**GL, "commit": "81fc668f98e21eb044ec9646283137022d82e669"}
_GEN = "cmd/generate/config/rules/generic.go"


def plausible(charset: str, n: int, seed: str) -> str:
    """gitleaks' newPlausibleSecret(`[charset]{n}`): a random string of the class with a digit 1-9,
    drawn here from a seeded generator so that the file is reproducible."""
    import random

    rng = random.Random(seed)
    while True:
        s = "".join(rng.choice(charset) for _ in range(n))
        if any(c in "123456789" for c in s):
            return s


_AZ09 = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

# connection strings: ODBC / ADO.NET / JDBC key=value;Password=…;, Azure's, App Configuration's
case("connection-string", KF, K.format("odbc"), "kingfisher.odbc.1",
     '//Database Info\n$host = "localhost";\n$database = "NHOHVA";\n$user = "mg1021"; $password = goodspec;\n', "goodspec")
case("connection-string", {**NP, "commit": "259838562bd552a76b592e980d8547ed00699497"}, NPR.format("odbc"), "np.odbc.1",
     '<add name="DevQATrucks" connectionString="Server=hookupsqlqa1\\gpkqa; Database=YogurtDelay: User Id=kmwulfliq; '
     'password= sK!g2Ex_=jJ6Gx5v" providerName="System.Data.SqlClient" />', "sK!g2Ex_=jJ6Gx5v")
case("connection-string", {**NP, "commit": "01d5871fed266f529f03eef7a754aeee1854461b"}, NPR.format("generic"), "np.generic.10",
     '<add key="ConnectionString_B2B" value="Server=awsbman-t,1433;Database=B2B;User ID=b2buser;Password=#gets0m3;'
     'Trusted_Connection=False" />', "#gets0m3")
_JDBC = {**KFR, "commit": "2ed94f75d7ef0dd6378b136ab71ce907cb13c5b4"}
case("connection-string", _JDBC, "data/rules/jdbc.yml", "kingfisher.jdbc.1",
     "jdbc:postgresql://db.example.com:5432/app?user=admin&password=s3cr3t", "s3cr3t")
case("connection-string", _JDBC, "data/rules/jdbc.yml", "kingfisher.jdbc.1",
     "jdbc:mysql://admin:s3cr3t@prod.internal:3306/inventory", "s3cr3t")
case("connection-string", _JDBC, "data/rules/jdbc.yml", "kingfisher.jdbc.1",
     "jdbc:sqlserver://sql.example.org:1433;databaseName=inventory;user=sa;password=s3cr3t!", "s3cr3t!")
case("connection-string", KF, K.format("azure"), "kingfisher.azure.1",
     "# Azure Storage Connection String\nAzureWebJobsStorage=DefaultEndpointsProtocol=https;AccountName=hanatour9833;"
     "AccountKey=6jqh42QQjWWBwoPGGR/Jr0PZjhBMZVbHm/gkhEfHvOj8aV6+oI8ed6ZAAwB5a6993WqyQDiuJJB0QpseJwqYxw==;"
     "EndpointSuffix=core.windows.net\n",
     "6jqh42QQjWWBwoPGGR/Jr0PZjhBMZVbHm/gkhEfHvOj8aV6+oI8ed6ZAAwB5a6993WqyQDiuJJB0QpseJwqYxw==")
case("connection-string", KF, K.format("azure"), "kingfisher.azure.1",
     "DefaultEndpointsProtocol=http;AccountName=testacc1;\n"
     "AccountKey=1gy3lpE7Du1j5ljKiupgKzywSw2isjsa69sfsdfsdsgfsgfdgfdgfd/YThisv/OVVLfIOv9kQ==;\n"
     "BlobEndpoint=http://127.0.0.1:8440/testacc1;\nTableEndpoint=http://127.0.0.1:8440/testacc1;\n"
     "QueueEndpoint=http://127.0.0.1:8440/testacc1;\n",
     "1gy3lpE7Du1j5ljKiupgKzywSw2isjsa69sfsdfsdsgfsgfdgfdgfd/YThisv/OVVLfIOv9kQ==")
case("connection-string", KF, K.format("azure"), "kingfisher.azure.1",
     '"IOTHUB_CONNECTION_STRING": {\n  "value": "HostName=d1-vi-ioth521.azure-devices.net;SharedAccessKeyName=registryReadWrite;'
     'SharedAccessKey=S8ii67l3Gd1Ba69az78iP9UksewzhjvUfh1DIuDs30w="\n}\n', "S8ii67l3Gd1Ba69az78iP9UksewzhjvUfh1DIuDs30w=")
case("connection-string", KF, K.format("azure"), "kingfisher.azure.1",
     '"AZURE_STORAGE_CONNECTION_STRING": {\n  "value": "DefaultEndpointsProtocol=https;AccountName=d1biblobstor521;'
     'AccountKey=NjEwGHd9+piK+iCi2C2XURWPmeDDjif9UKN1HAszYptL4iQ+yD7/dgjLMZc3VOpURsa53aJ4HZfbVWzL429C5g==;'
     'EndpointSuffix=core.windows.net"\n}\n',
     "NjEwGHd9+piK+iCi2C2XURWPmeDDjif9UKN1HAszYptL4iQ+yD7/dgjLMZc3VOpURsa53aJ4HZfbVWzL429C5g==")
for _text, _secret in (
        ("Endpoint=https://foo-nonprod-appconfig.azconfig.io;Id=ABCD-E6-s0:tl6ABcdefGHi7kLMno/p;"
         "Secret=abCD1EF+GHIJxLMnOPqRSa53VWX05zaBCdE/fg9hi4k=", "abCD1EF+GHIJxLMnOPqRSa53VWX05zaBCdE/fg9hi4k="),
        ("https://foo-nonprod-appconfig.azconfig.io;Id=ABCD-E6-s0:tl6ABcdefGHi7kLMno/p;"
         "Secret=abCD1EF+GHIJxLMnOA53ST8uVWX05zaBCdE/fg9hi4k=", "abCD1EF+GHIJxLMnOA53ST8uVWX05zaBCdE/fg9hi4k="),
        ("Endpoint=https://appconfig-test01.azconfig.io;Id=09pv-l0-s0:opFCQMC6+9485xJgN5Ws;"
         "Secret=GcoEA53t7GLRNJ910M46IrbHO/Vg0tt4HujRdsaCoTY=", "GcoEA53t7GLRNJ910M46IrbHO/Vg0tt4HujRdsaCoTY="),
        ('        private static string appConfigurationConnectionString = "Endpoint=https://appcs-fg-pwc.azconfig.io;'
         'Id=pi5x-l9-s0:SZLlhHA53Nz2MpAl04cU;Secret=CQ+mlfQqkzfZv4XA53gigJ/seeXMKwNsqW/rM3wmtuE=";',
         "CQ+mlfQqkzfZv4XA53gigJ/seeXMKwNsqW/rM3wmtuE=")):
    case("connection-string", KF, K.format("azure"), "kingfisher.azure.2", _text, _secret)
case("connection-string", {**GHAS, "commit": "1628733ddff9e62a05907a71b27910b1f008a30a"}, "database/connection_strings.txt",
     "ghas.database_connection_string",
     '# pscale\n"server=127.0.0.1;uid=root;pwd=pscale_pw_fAagpYk49fh0rvL-Ag-7J3HMq6oXk7p1ObLDn4PLHO8;database=test"\n',
     "pscale_pw_fAagpYk49fh0rvL-Ag-7J3HMq6oXk7p1ObLDn4PLHO8")
_P = plausible(_AZ09 + "+/", 30, "generic-api-key ID=dbuser")
case("connection-string", _GLG, _GEN, "generic-api-key", f'ID=dbuser;password={_P};"', _P, "generated")

# INI, env, properties, YAML and .NET configuration keys
_SPRING = {**GHAS, "commit": "61644d7c9080d751cc6cd0568b676412cd22ce29"}
for _text, _secret in (("# with spaces\nspring.datasource.password = root\n", "root"),
                       ("# no spaces\nspring.datasource.password=SQLSpringPassword\n", "SQLSpringPassword"),
                       ("# quoted password\nspring.datasource.password='QuotedSpringPassword'\n", "QuotedSpringPassword"),
                       ("# MySQL\nspring.datasource.url=jdbc:mysql://localhost:3306/test\nspring.datasource.username=dbuser\n"
                        "spring.datasource.password=dbpass2\nspring.datasource.driver-class-name=com.mysql.jdbc.Driver\n", "dbpass2"),
                       ("# Oracle\nspring.datasource.url=jdbc:oracle:thin:@localhost:1521:orcl\nspring.datasource.username=dbuser\n"
                        "spring.datasource.password=dbpass3\nspring.datasource.driver-class-name=oracle.jdbc.OracleDriver\n", "dbpass3"),
                       ("# SQL Server\nspring.datasource.url=jdbc:sqlserver://localhost;databaseName=springbootdb\n"
                        "spring.datasource.username=dbuser\nspring.datasource.password=dbpass4\n", "dbpass4")):
    case("ini-env", _SPRING, "configs/application.properties", "ghas.hardcoded_spring_sql_passwords", _text, _secret)
_COMPOSE = ("    environment:\n      MYSQL_ROOT_PASSWORD: SecretMySQLR00tPassword\n      MYSQL_USER: wordpress\n"
            "      # ISSUE\n      MYSQL_PASSWORD: MySQLPassword\n")
for _secret in ("SecretMySQLR00tPassword", "MySQLPassword"):
    case("ini-env", {**GHAS, "commit": "48793843a97580a15bbe86fbe6f0714f36290896"}, "configs/mysql/docker-compose.yml",
         "ghas.hardcoded_database_passwords", _COMPOSE, _secret)
case("ini-env", {**GHAS, "commit": "129613905bfea087a69b2d5b59c6c4903161841b"}, "configs/postgres/docker-compose.yml",
     "ghas.hardcoded_database_passwords", "    environment:\n      - POSTGRES_PASSWORD=webgoat\n", "webgoat")
case("ini-env", {**GHAS, "commit": "3eb2706f6137822e2da38194e636353ca40a9d9e"}, "configs/example.yml",
     "ghas.yaml_static_password_fields", "\nmain:\n  database:\n    username: wordpress\n    password: MySecureSecretPassword!\n",
     "MySecureSecretPassword!")
case("ini-env", {**GHAS, "commit": "2434bfeb4f664c4b76ab94c523b4daf0650dcb4f"}, "configs/app.config",
     "ghas.dotnet_configuration_file",
     '<configuration>\n<appSettings>\n  <add key="password" value="correcthorsebatterystaple"/>\n</appSettings>\n</configuration>\n',
     "correcthorsebatterystaple")
case("ini-env", {**GHAS, "commit": "03a40ed7b906624cee40512a58c4a9ccc63b4c10"}, "generic/patterns.yml (test data)",
     "ghas.generic_passwords", "password=Password123", "Password123")
case("ini-env", {**NP, "commit": "01d5871fed266f529f03eef7a754aeee1854461b"}, NPR.format("generic"), "np.generic.9",
     '<add key="FromEmailAddress" value="killer.joe@example.com"/>\n<add key="FromEmailPassword" value="Prestigitariu$"/>\n',
     "Prestigitariu$")
for _text, _secret in ((":password       => '4ian1234',\n", "4ian1234"),
                       ("common.then_log_in({username: 'geronimo', password: '52VeZqtHDCdAr5yM'});\n", "52VeZqtHDCdAr5yM"),
                       ("beta => {\n  host            => 'foo.example.com',\n  user            => 'joe',\n"
                        "  password        => 'thisismypassword',\n}\n", "thisismypassword")):
    case("ini-env", {**NP, "commit": "01d5871fed266f529f03eef7a754aeee1854461b"}, NPR.format("generic"), "np.generic.6",
         _text, _secret)
_DB2 = {**DS, "commit": "31ffb6316c9d289de093009f0c20a7b312a002be"}
for _text, _secret in (("dbpwd=$omespeci@!ch@r$", "$omespeci@!ch@r$"), ('db2_password = "astring"', "astring"),
                       ('"password": "Iusedb2!"', "Iusedb2!"), ('password =    "ilikespaces"', "ilikespaces"),
                       ("pwd::anothersyntax!", ":anothersyntax!"), ('DB2_PASSWORD = "@#!%#"', "@#!%#")):
    case("ini-env", _DB2, "tests/plugins/db2_test.py", "ds.db2", _text, _secret)
_INI = {**DS, "commit": "15701df6d09adf4e8ce2073c73238aaa3381d2fc"}
case("ini-env", _INI, "test_data/config.ini", "ds.config.ini", "[credentials]\npassword = 12345678901234\n", "12345678901234")
case("ini-env", _INI, "test_data/config.ini", "ds.config.ini", "[aws]\naws_secret_key = 2345678901\n", "2345678901")
case("ini-env", {**DS, "commit": "1c899da1e5d9bd2c757bc44ff77a1c651c2aebc2"}, "test_data/config.env", "ds.config.env",
     "mimi=gX69YO4CvBsVjzAwYxdGyDd30t5+9ez31gKATtj4\n", "gX69YO4CvBsVjzAwYxdGyDd30t5+9ez31gKATtj4")
for _key, _charset, _n, _quote in (("passwd = ", _AZ09 + "-_.=", 30, ""), ("private-key: ", _AZ09 + "-_.=", 100, ""),
                                   ("todo_secret_do_not_commit = ", _AZ09, 30, ""), ("creds = ", _AZ09, 30, ""),
                                   ("mySecretString=", _AZ09, 30, ""), ("some_api_token_123 = ", _AZ09, 60, '"')):
    _P = plausible(_charset, _n, f"generic-api-key {_key}")
    case("ini-env", _GLG, _GEN, "generic-api-key", f"{_key}{_quote}{_P}{_quote}", _P, "generated")
case("ini-env", _GLG, _GEN, "generic-api-key", "'access_token': 'eyJ0eXAioiJKV1slS3oASx=='", "eyJ0eXAioiJKV1slS3oASx==")
case("ini-env", _GLG, _GEN, "generic-api-key", '"user_auth": "am9obmRvZTpkMDY5NGIxYi1jMTcxLTQ4ODYt+TMyYS0wMmUwOWQ1/mIwNjc="',
     "am9obmRvZTpkMDY5NGIxYi1jMTcxLTQ4ODYt+TMyYS0wMmUwOWQ1/mIwNjc=")
case("ini-env", _GLG, _GEN, "generic-api-key",
     '"credentials" : "0afae57f3ccfd9d7f5767067bc48b30f719e271ba470488056e37ab35d4b6506"',
     "0afae57f3ccfd9d7f5767067bc48b30f719e271ba470488056e37ab35d4b6506")
case("ini-env", _GLG, _GEN, "generic-api-key", '"env": {\n"API_TOKEN": "Lj2^5O%xi214"', "Lj2^5O%xi214")  # a commented-out tp

# passwords stated in prose (Nosey Parker's own examples; np.generic.1's is one it lists as still missed)
_NPG = {**NP, "commit": "01d5871fed266f529f03eef7a754aeee1854461b"}
case("prose", _NPG, NPR.format("generic"), "np.generic.1", "    Ldap password               ----   H7IKC85R#@4$",
     "H7IKC85R#@4$")
case("prose", _NPG, NPR.format("generic"), "np.generic.11",
     "echo \"Rrun 'bin/ipa_kinit admin' to acquire a Kerberos ticket\"\necho \"The password is 'Secret123'\"\n", "Secret123")
case("prose", _NPG, NPR.format("generic"), "np.generic.11",
     "The Blooby has a default Access Point Name 'Blooby'\nThe default Password is 'blooberry'\n", "blooberry")
case("prose", _NPG, NPR.format("generic"), "np.generic.12",
     'so at this point, just fill in your mount point name, ensure the password is "centipede" and press the "On" button!\n',
     "centipede")
case("prose", _NPG, NPR.format("generic"), "np.generic.13",
     "2. Ensure the password for user 'postgres' is 'admin' or change .env file.\n", "admin")
case("prose", _NPG, NPR.format("generic"), "np.generic.14",
     'The default password for the user "pyne-user" is "pyne".\n', None)  # "pyne" also spells the user name

# URLs with a password (the rules' own examples)
case("url", {**NP, "commit": "259838562bd552a76b592e980d8547ed00699497"}, NPR.format("postgres"), "np.postgres.1",
     '"REDSHIFT": "postgres://spot_app:Pseg2020@calling-mr-bones.c0qsadyxbf4k.us-east-1.redshift.amazonaws.com:5439/datalakespotprod",',
     "Pseg2020")
case("url", {**KFR, "commit": "8d03f16f8a57bf0395f9c251afc2d61ae02bbbc6"}, "data/rules/mysql.yml", "kingfisher.mysql.1",
     'CONNECTION_URI="mysql://nimda:m42p!o@2wd@google.com:3306/elephant"', "m42p!o@2wd")
case("url", KF, K.format("rabbitmq"), "kingfisher.rabbitmq.1", "amqps://admin:3eCa3P@192.168.1.10:5671/vhost", "3eCa3P")
case("url", {**KFR, "commit": "669110ccae72a72c40d7042cb97fd5a810d05baa"}, "data/rules/credentials.yml",
     "kingfisher.credentials.1", "https://eaRIWNkE:qyOIhJiM@j2LYY414Q5cCYD", "qyOIhJiM")
case("url", {**GHAS, "commit": "03adafcca2c22c849cc6581ec336a5b8757b38aa"}, "uri/app.py", "ghas.hardcoded_uri_passwords",
     "app.config['SQLALCHEMY_DATABASE_URI'] = 'mysql://python:HelloSecretScanning@myhost1:1111/db'", "HelloSecretScanning")
case("url", {**DS, "commit": "16a19153cf95c507f6217a93cadd2cfed38af5e3"}, "test_data/each_secret.py", "ds.each_secret",
     "basic_auth = 'http://username:whywouldyouusehttpforpasswords@example.com'", "whywouldyouusehttpforpasswords")

# -- round 5: new sources for the weakest families (connection strings, config keys, prose) ---------
# Every example of the files below that states a credential of these families is taken as written,
# except, as in round 4, one whose secret is a documented stand-in (secret, password, mypass,
# myPassword, your-password, {your_password}, <password>, foo, bar, ######), one the source marks as
# not to be found (a localhost server its rule ignores, a malformed string, a negative example), a
# value that is a variable in code (password: password_6), and one already above. Files that repeat
# another's examples (SEC101_046 / SEC101_037, SEC101_047 / SEC101_036, SEC101_045 and SEC101_114 /
# SEC101_038, secretlint's ng.mysql / additional.cases) are taken once, from the fuller file. The
# rule id names the file (its split drawn from it like every other: crc32, above).
SPM = {"repo": "microsoft/sarif-pattern-matcher", "licence": "MIT"}
SPMI = "Src/Plugins/Tests.Security/TestData/SecurePlaintextSecrets/Inputs/{}.ps1"
_SQL = {**SPM, "commit": "86152e58226bd5327147474afbf80f980cad67fd"}
_SQLP, _SQLR = SPMI.format("SEC101_037.SqlConnectionString"), "spm.SEC101_037.SqlConnectionString"


def _xml_add(conn: str) -> str:
    return ('    <add name="YourConnectionStringKey" \n        providerName="System.Data.SqlClient"\n'
            f'        connectionString="{conn}" />')


for _text, _secret in (
        ("jdbc:sqlserver://servername1.database.windows.net:1433;database=database1;user=username1@some-database-name;"
         "password=password1;encrypt=true;trustServerCertificate=false;hostNameInCertificate=*.database.windows.net;"
         "loginTimeout=30;", "password1"),
        ("Driver={ODBC Driver 13 for SQL Server};Server=tcp:servername2.database.windows.net,1433;Database=database2;"
         "Uid=username2;Pwd=password2;Encrypt=yes;TrustServerCertificate=no;Connection Timeout=30;", "password2"),
        ('new PDO("sqlsrv:server = tcp:servername3.database.windows.net,1433; Database = databse3", "username3", '
         '"password3");', "password3"),
        (_xml_add("Data Source=servername4;Initial Catalog=database4;User ID=username4;Password=password4;"), "password4"),
        (_xml_add("Password=password5;User ID=username5;Initial Catalog=database5;Data Source=database5;"), "password5"),
        (_xml_add("Initial Catalog=database6;Data Source=servername6;Password=password6;User ID=username6;"), "password6"),
        ("<Connection>\n    <SqlServer>Data Source=servername15;Initial Catalog=database15;User ID=username15;"
         "Password=password15</SqlServer>\n</Connection>", "password15"),
        ('  <add key="ConnectionString" value="Data Source=servername8;Initial Catalog=database8;User ID=username8;'
         'Password=password8;" />', "password8"),
        ('  <add key="ConnectionString" value="Password=password9;User ID=username9;Initial Catalog=database9;'
         'Data Source=servername9;" />', "password9"),
        ('  <add key="ConnectionString" value="Initial Catalog=database10;Data Source=servername10;Password=password10;'
         'User ID=username10;" />', "password10"),
        ('  <add key="ConnectionString" value="Data Source=servername17;Initial Catalog=database17;User ID=username17;'
         'Password=password17" />', "password17"),
        ('[global::System.Configuration.DefaultSettingValueAttribute("Data Source=servername14;Initial Catalog=database14;'
         'User ID=username14;Password=password14")]\n        public string ELSConnectionString {', "password14"),
        ('{\n    "connectionString" : "Data Source=servername16;Initial Catalog=database16;User ID=username16;'
         'Password=password16",\n    "propertyA": "propertyA"\n    "propertyB": "propertyB"\n}', "password16"),
        ("Data Source=(local);Initial Catalog=AdventureWorks;User ID=ab;Password= a1Pass@@11\n    Modified: Data Source=(local);",
         "a1Pass@@11"),
        ("connect('DRIVER={SQL Server};SERVER=servername18;DATABASE=database18;PWD=password18;UID=username18') ",
         "password18"),
        ("DRIVER=SQL server;SERVER=servername19;UID=username19;PWD=password19;APP=Microsoft ODBC SDK;DATABASE=database19\n"
         "some random text", "password19")):
    case("connection-string", _SQL, _SQLP, _SQLR, _text, _secret)

_MY = {**SPM, "commit": "5b1077f834fb1b38912c57a023890166a10016e4"}
_MYP, _MYR = SPMI.format("SEC101_036.MySqlCredentials"), "spm.SEC101_036.MySqlCredentials"
for _text, _secret in (
        ("Server=some-database-name.mysql.database.azure.com; Port=3306; Database=catalog_db; "
         "Uid=username@some-database-name; Pwd=password_1; SslMode=Preferred;", "password_1"),
        ("Port=3306; Server=some-database-name.mysql.database.azure.com; Database=catalog_db; "
         "Uid=username@some-database-name; Pwd=password_2; SslMode=Preferred;", "password_2"),
        ("Server=some-database-name.mysql.database.azure.com; Database=catalog_db; Uid=username@some-database-name; "
         "Pwd=password_3; SslMode=Preferred;Port=3306; ", "password_3"),
        ("Server=some-database-name.mysql.database.azure.com;Database=catalog_db; SslMode=Preferred; Pwd=password_4; "
         "Uid=username@some-database-name;", "password_4"),
        ('String url ="jdbc:mysql://some-database-name.mysql.database.azure.com:3306/catalog_db?useSSL=true&requireSSL=false"; '
         'myDbConn = DriverManager.getConnection(url, "username@some-database-name", "PASSword_5");', "PASSword_5"),
        ("Database=catalog_db; Data Source=some-database-name.mysql.database.azure.com; User Id=username@some-database-name; "
         "Password=password_10", "password_10"),
        ('string connection = "Server=your-host; Port=3306; Database=your-database; Uid=username@servername; '
         'Pwd=password_11; SslMode=Preferred;";', "password_11"),
        ('Server= "mydemoserver.mariadb.database.azure.com"; Port=3306; Database= "wpdb"; Uid= "WPAdmin@mydemoserver"; '
         'Pwd="mypassword!2"; SslMode=Required;', "mypassword!2"),
        ('String dbUrl = "jdbc:mysql://" + dbUri.getHost() + dbUri.getPath();\n'
         'return DriverManager.getConnection(dbUrl, "cleardbusername1", "cleardb_PASSWORD1");', "cleardb_PASSWORD1")):
    case("connection-string", _MY, _MYP, _MYR, _text, _secret)

_PG = {**SPM, "commit": "2ff5df4e7dfe4a890c5c4c1e453d9e4ba87e27eb"}
_PGP, _PGR = SPMI.format("SEC101_038.PostgreSqlCredentials"), "spm.SEC101_038.PostgreSqlCredentials"
for _conn, _secret in (("host=my_host;Port=5555;Database=my_db;Username=my_user;Password=my_pw_1", "my_pw_1"),
                       ("host=my_host;Database=my_db;Username=my_user;Password=my_pw_2;Port=5555", "my_pw_2"),
                       ("Host=my_host;Port=5555;UsErname=my_user;Password=my_pw_3", "my_pw_3"),
                       ("Password=my_pw_4;Host=my_host;Port=5555;Username=my_user;Pooling=true", "my_pw_4"),
                       ("Port=5555;Password=my_pw_5;Connection Pruning Interval=doodle;Host=my_host;Username=my_user;"
                        "Pooling=true", "my_pw_5"),
                       ("Port=5555;Password=my_pw_6;Connection Pruning Interval=doodle;Host=my_host;Username=my_user;"
                        "Pooling=true;Port=5555", "my_pw_6"),
                       ("Database=my_db;Port=5555;Password=my_pw_7;Connection Pruning Interval=doodle;Host=my_host;"
                        "Username=my_user;Pooling=true; Port=5555", "my_pw_7")):
    case("connection-string", _PG, _PGP, _PGR, f'<add name="BlogDbContext" connectionString="{_conn}">', _secret)
for _family, _text, _secret in (
        ("connection-string", '{\n    "ConnectionString" : "host=my_host;Port=5555;Database=my_db;Username=my_user;'
         'Password=my_pw_8",\n    "PropertyA": "This should not be caught"\n}', "my_pw_8"),
        ("connection-string", "<Connections>\n    <Postgres>host=my_host;Port=5555;Database=my_db;Username=my_user;"
         "Password=my_pw_9</Postgres>\n</Connections>", "my_pw_9"),
        ("ini-env", "PGUSER=dbuser \\\nPGHOST=database.server.com \\\nPGPASSWORD=secretpassword_1 \\\nPGDATABASE=mydb \\\n"
         "PGPORT=3211 \\\nnode script.js", "secretpassword_1"),
        ("ini-env", "const pool = new Pool({\n  user: 'dbuser',\n  host: 'database.server.com',\n  database: 'mydb',\n"
         "  password: 'secretpassword_2',\n  port: 3211,\n})", "secretpassword_2"),
        ("ini-env", "const pool = new Pool({ user: 'dbuser', host: 'database.server.com', database: 'mydb', "
         "password: 'secretpassword_3', port: 3211,})", "secretpassword_3"),
        ("ini-env", "const client = new Client({\n  user: 'dbuser',\n  host: 'database.server.com',\n  database: 'mydb',\n"
         "  password: 'secretpassword_4',\n  port: 3211,\n})", "secretpassword_4"),
        ("ini-env", "const client = new Client({ user: 'dbuser', host: 'database.server.com', database: 'mydb', "
         "password: 'secretpassword_5', port: 3211,})", "secretpassword_5"),
        ("connection-string", 'conn = psycopg2.connect("dbname=suppliers user=postgres password=postgres")', None),
        ("ini-env", 'conn = psycopg2.connect(\n    host="localhost",\n    database="suppliers",\n    user="postgres",\n'
         '    password="Abcd1234")', "Abcd1234"),
        ("ini-env", 'conn = psycopg2.connect(host="localhost",database="suppliers",user="postgres",password="Abcd12345")',
         "Abcd12345"),
        ("ini-env", "con = PG.connect :dbname => 'testdb', :user => 'janbodnar', :password => 'pswd37'", "pswd37")):
    case(_family, _PG, _PGP, _PGR, _text, _secret)

# secretlint's database-connection-string rule: its test inputs (MIT)
_SL = {"repo": "secretlint/secretlint", "commit": "571e930a962e35af43eb2d006d26eb59d813104f", "licence": "MIT"}
_SLP = "packages/@secretlint/secretlint-rule-database-connection-string/test/snapshots/{}/input.txt"
_SLR = "secretlint.database-connection-string"
for _text, _secret in (
        ('const MONGO_URI = "mongodb://realuser:s3cr3tP4ss@db1.example.net:27017/production";', "s3cr3tP4ss"),
        ('const MONGO_SRV = "mongodb+srv://appuser:myR3alP@ssw0rd@cluster0.mongodb.net/mydb?retryWrites=true";',
         "myR3alP@ssw0rd"),
        ('const MYSQL_URI = "mysql://dbuser:compl3xPwd@mysql.server.com:3306/database";', "compl3xPwd"),
        ('const MYSQL_JDBC = "jdbc:mysql://admin:str0ngP4ss@db.company.com:3306/app_db";', "str0ngP4ss"),
        ('const PG_URI = "postgresql://pguser:secur3Pass@postgres.example.com:5432/production_db";', "secur3Pass"),
        ('const POSTGRES_URI = "postgres://api_user:myC0mpl3xPwd@db.internal.com:5432/api_db";', "myC0mpl3xPwd")):
    case("url", _SL, _SLP.format("ng.secret"), _SLR, _text, _secret)
for _family, _text, _secret in (
        ("url", 'CONECTION_URI="mongodb://root:m42ploz2wd@google.com:5434/thegift"', "m42ploz2wd"),
        ("url", "mongodb+srv://testuser:hub24aoeu@gg-is-awesome-xm273.mongodb.net/test?retryWrites=true&w=majority",
         "hub24aoeu"),
        ("url", 'CONNECTION_URI="mysql://root:m42ploz2wd@google.com:5434/thegift"', "m42ploz2wd"),
        ("connection-string", "mysql --user=doadmin --password=strongp@55! "
         "--host=db-mysql-ams3-23775-do-user-7772205-0.a.db.ondigitalocean.com", "strongp@55!"),
        ("url", 'CONNECTION_URI="postgres://postgres:m42p! o@2wd@google.com:5434/thegift"', "m42p! o@2wd"),
        ("ini-env", "PG_USERNAME=root. PG_PASSWORD=m42ploz2wd", "m42ploz2wd"),
        ("ini-env", "PGPASSWORD=strongp@ss psql -hdb-postgresql-ams3-58486-do-user-7772205-0.b.db.ondigitalocean.com "
         "-Udoadmin -p 25060", "strongp@ss"),
        ("url", "create_engine('postgresql://postgres:m42ploz2wd@google.com:5432/mydb')", "m42ploz2wd")):
    case(_family, _SL, _SLP.format("additional.cases"), _SLR, _text, _secret)

# Nosey Parker's MongoDB rule and Kingfisher's: their examples not above
_NPM = {**NP, "commit": "83750401318a09c3656a89e559751f913ef8d049"}
case("url", _NPM, NPR.format("mongo"), "np.mongodb.1",
     'spring:\n  application:\n    name: Prince\n  data:\n    mongodb:\n      uri: "mongodb+srv://servicelogin:'
     'CPCdZH5k0F6dxQ9V@example-prince.mongodb.net/?retryWrites=true&w=majority"\n      database: prince\n',
     "CPCdZH5k0F6dxQ9V")
for _text in ("mongodb://myDatabaseUser:D1fficult@localhost", "mongodb://myDatabaseUser:D1fficult@localhost/database"):
    case("url", _NPM, NPR.format("mongo"), "np.mongodb.1", _text, "D1fficult")
for _rest in ("localhost", "localhost/records", "cluster0.example.mongodb.net/?retryWrites=true&w=majority",
              "mongodb0.example.com/?authSource=admin&replicaSet=myRepl",
              "mongodb0.example.com:27017,mongodb1.example.com:27017,mongodb2.example.com:27017/?authSource=admin&replicaSet=myRepl",
              "localhost,localhost:27018,localhost:27019/?replicaSet=test",
              "example1.com,example2.com,example3.com/?replicaSet=test&readPreference=secondary",
              "router1.example.com:27017,router2.example2.com:27017,router3.example3.com:27017/",
              "example1.com,example2.com,example3.com/?replicaSet=test&w=majority&wtimeoutMS=2000"):
    _scheme = "mongodb+srv" if _rest.startswith(("cluster0", "mongodb0.example.com/")) else "mongodb"
    case("url", _NPM, NPR.format("mongo"), "np.mongodb.1", f"{_scheme}://myDatabaseUser:D1fficultP%40ssw0rd@{_rest}",
         "D1fficultP%40ssw0rd")
case("url", _NPM, NPR.format("mongo"), "np.mongodb.1",
     "var store = new MongoDBStore({\n  uri: 'mongodb+srv://somethingrotten:Zxcvbnm@12345)@cluster0-cnc84.mongodb.net/"
     "e-commerce?retryWrites=true',\n  collection: 'mySessions',\n});\n", "Zxcvbnm@12345)")
case("url", _NPM, NPR.format("mongo"), "np.mongodb.1", "mongodb+srv://hpapp:bria@pass135!@briaserver.7xsu17j.mongodb.net/test",
     "bria@pass135!")
case("url", KF, K.format("mongodb"), "kingfisher.mongodb.3", '"mongodb://mongoadmin:contoso@something.foo.mongodb.net/myFirstDatabase"',
     "contoso")

# Kingfisher's generic password rules: the examples not above (round 1 took some, or put them in other forms)
for _rule, _text, _secret in (
        ("kingfisher.generic.3", "hostname = '10.11.12.13'\nusername = 'donjuandemarco@example.com'\npassword = '`123QWERasdf'\n",
         "`123QWERasdf"),
        ("kingfisher.generic.3", "user = 'abuser'  # some comment\npassword = 'abuser123456'  # some other comment\n",
         "abuser123456"),
        ("kingfisher.generic.3", "user = 'Aladdin'\npassword = 'open sesame'\n", "open sesame"),
        ("kingfisher.generic.4", "user = Aladdin\n// some comment\n// some other comment\npassword = open_sesame\n", "open_sesame"),
        ("kingfisher.generic.5", 'password = "super$ecret"\n', "super$ecret"),
        ("kingfisher.generic.5", 'password="super$ecret"\n', "super$ecret"),
        ("kingfisher.generic.5", '"password": "super$ecret",\n', "super$ecret"),
        ("kingfisher.generic.5", 'password   =>   "super$ecret"\n', "super$ecret"),
        ("kingfisher.generic.5", '"ApplicationServicesConnection" : {\n    "ServiceAddress" : "https://services-dev.examples.com",\n'
         '    "AdminPassword" : "thisismypassword"\n}\n', "thisismypassword"),
        ("kingfisher.generic.5", 'private const string DevFolkoosComPfxPassword = "thisismypassword";\n', "thisismypassword"),
        ("kingfisher.generic.5", "create_random_name('sfrp-cli-cert2', 24),\n            'cluster_name': "
         "self.create_random_name('sfrp-cli-', 24),\n            'vm_password': \"Pass123!@#\",\n            'policy_path': "
         "os.path.join(TEST_DIR, 'policy.json')\n        })\n", "Pass123!@#")):
    case("ini-env", KF, K.format("generic"), _rule, _text, _secret)

# a password stated in prose: proselint's security.password check, its test's own failing example
case("prose", {"repo": "amperser/proselint", "commit": "3da41d8f6e6627884f6e05f9d3314745cdafb6e5", "licence": "BSD-3-Clause"},
     "tests/test_security_password.py", "proselint.security.password", "The password is 123456.", "123456")

# -- round 6: more of the thinnest families (kubeconfig, JDBC, unlabelled tokens, config files) -------
# As round 5: every example of the files below that states a credential of these families, taken as
# written, except a documented stand-in (pass, secret, mypass, mypassword, MY-PASSWORD), one the
# source marks as not to be found (trufflehog's "no host" cases, a negative example, a filler token
# xoxb-0000…), and one already above. gitleaks' kubernetes-secret-yaml true positives (the one
# round 1 took, as JSON, aside): each file's data value (the password where a Secret has two).
for _text, _secret in (
        ("\napiVersion: v1\nkind: Secret\nmetadata:\n  name: heketi-secret\n  namespace: default\ndata:\n"
         '  # base64 encoded password. E.g.: echo -n "mypassword" | base64\n  key: bXlwYXNzd29yZA==', "bXlwYXNzd29yZA=="),
        ("apiVersion: v1\n data:\n \textra: YWRtaW46cGFzc3dvcmQ=\n kind: secret\n metadata:\n\t name: secret-sa-sample\n"
         "\t annotations:\n\t \tkubernetes.io/service-account.name: 'sa-name'", "YWRtaW46cGFzc3dvcmQ="),
        ("apiVersion: v1\ndata:\n\tpassword: UyFCXCpkJHpEc2I9\n\tusername: YWRtaW4=\nkind: Secret\nmetadata:\n"
         "\tcreationTimestamp: '2022-06-28T17:44:13Z'\n\tname: db-user-pass\n\tnamespace: default\ntype: Opaque",
         "UyFCXCpkJHpEc2I9"),
        ("apiVersion: v1\ndata:\n\t# the data is abbreviated in this example\n\tpassword: UyFCXCpkJHpEc2I9\n\tusername: YWRtaW4=\n"
         "kind: Secret\nmetadata:\n\tcreationTimestamp: '2022-06-28T17:44:13Z'\n\tname: db-user-pass\n\tnamespace: default\n"
         "type: Opaque", "UyFCXCpkJHpEc2I9"),
        ("apiVersion: 'v1'\ndata:\n\textra: 'YWRtaW46cGFzc3dvcmQ='\nkind: 'Secret'\nmetadata:\n\tname: 'secret-sa-sample'\n"
         "\tannotations:\n\t\tkubernetes.io/service-account.name: 'sa-name'", "YWRtaW46cGFzc3dvcmQ="),
        ('apiVersion: "v1"\ndata:\n\textra: "YWRtaW46cGFzc3dvcmQ="\nkind: "secret"\nmetadata:\n\tname: "secret-sa-sample"\n'
         '\tannotations:\n\t\tkubernetes.io/service-account.name: "sa-name"', "YWRtaW46cGFzc3dvcmQ="),
        ("apiVersion: v1\ndata:\n  .dockercfg: |\n    eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo=\n"
         "metadata:\n  name: secret-dockercfg\ntype: kubernetes.io/dockercfg\nkind: Secret\n",
         "eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo="),
        ("apiVersion: v1\ndata:\n  .dockercfg: >\n    eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo=\n"
         "metadata:\n  name: secret-dockercfg\ntype: kubernetes.io/dockercfg\nkind: Secret",
         "eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo="),
        ("apiVersion: v1\nkind: secret\ndata:\n\textra: YWRtaW46cGFzc3dvcmQ=\nmetadata:\n\tname: secret-sa-sample\n"
         "\tannotations:\n\t\tkubernetes.io/service-account.name: 'sa-name'", "YWRtaW46cGFzc3dvcmQ="),
        ("apiVersion: v1\nkind: Secret\nmetadata:\n\tcreationTimestamp: '2022-06-28T17:44:13Z'\n\tname: db-user-pass\n"
         "\tnamespace: default\ntype: Opaque\ndata:\n\t# the data is abbreviated in this example\n\tpassword: UyFCXCpkJHpEc2I9\n"
         "\tusername: YWRtaW4=\n", "UyFCXCpkJHpEc2I9"),
        ("apiVersion: 'v1'\nkind: 'Secret'\ndata:\n\tpassword: 'UyFCXCpkJHpEc2I9'\n\tusername: 'YWRtaW4='\nmetadata:\n"
         "\tname: 'db-user-pass'\n\tnamespace: 'default'\ntype: 'Opaque'", "UyFCXCpkJHpEc2I9"),
        ('apiVersion: "v1"\nkind: "Secret"\ndata:\n\tpassword: "UyFCXCpkJHpEc2I9"\n\tusername: "YWRtaW4="\nmetadata:\n'
         '\tname: "db-user-pass"\n\tnamespace: "default"\ntype: "Opaque"', "UyFCXCpkJHpEc2I9"),
        ("apiVersion: v1\nkind: Secret\nmetadata:\n  name: secret-dockercfg\ntype: kubernetes.io/dockercfg\ndata:\n"
         "  .dockercfg: |\n    eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo=\n",
         "eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo="),
        ("apiVersion: v1\nkind: Secret\nmetadata:\n  name: secret-dockercfg\ntype: kubernetes.io/dockercfg\ndata:\n"
         "  .dockercfg: >\n    eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo=",
         "eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo=")):
    case("kubeconfig", _GLK, "cmd/generate/config/rules/kubernetes.go", "kubernetes-secret-yaml", _text, _secret)

# trufflehog's JDBC detector tests (AGPL-3.0; test inputs as data): the URLs with a password, each
# given its "jdbc:<driver>:" head where the test passes only what follows it (form "jdbc")
TH = {"repo": "trufflesecurity/trufflehog", "licence": "AGPL-3.0"}
_THJ = "pkg/detectors/jdbc/{}"
for _text, _secret in (
        ("<jdbc-url>jdbc:mysql://testuser:testpassword@tcp(localhost:1521)/testdb</jdbc-url>", "testpassword"),
        ("<jdbc-url>jdbc:postgresql://localhost:1521/testdb?sslmode=disable&password=testpassword&user=testuser&</jdbc-url>",
         "testpassword")):
    case("connection-string", {**TH, "commit": "0007a1e0d0dd6d50a0d5a4af5baefb80d278674c"}, _THJ.format("jdbc_test.go"),
         "trufflehog.jdbc", _text, _secret)
for _rule, _file, _commit, _driver, _subnames in (
        ("trufflehog.jdbc.mysql", "mysql_test.go", "49f8269918b615238af0862052e34027eb47173c", "mysql",
         ("//examplehost.net:3306/dbname?user=root&password=secret123", "//root:secret123@tcp(examplehost.net:3306)/dbname",
          "//localhost/dbname?user=root&password=secret123", "//myuser:secret123@tcp(localhost:3306)/dbname")),
        ("trufflehog.jdbc.postgres", "postgres_test.go", "4b4a9f532dbc7dbf348b05d9b47cbbce32ec4172", "postgresql",
         ("//examplehost.net:5432/dbname?user=admin&password=secret123", "//localhost/dbname?user=postgres&password=secret123")),
        ("trufflehog.jdbc.sqlserver", "sqlserver_test.go", "0007a1e0d0dd6d50a0d5a4af5baefb80d278674c", "sqlserver",
         ("//examplehost.net;password=secret123", "//examplehost.net:1433;password=secret123",
          "//odbc:server=localhost;port=1433;database=testdb;password=testpassword"))):
    for _sub in _subnames:
        case("connection-string", {**TH, "commit": _commit}, _THJ.format(_file), _rule, f"jdbc:{_driver}:{_sub}",
             "testpassword" if "testpassword" in _sub else "secret123", "jdbc")

# Nosey Parker's Slack and GitHub rules: the examples that give the token with no label
_NPS = {**NP, "commit": "1b57a9fe4a451e751c4d219f5a9c64fb8d0e8c11"}
case("unlabelled", _NPS, NPR.format("slack"), "np.slack.4",
     'python log_announce.py xoxp-513768634356-513201028496-513937500594-185e196ace562dd6443b5d29b1d817c2 "This is a test run. Ignore"',
     "xoxp-513768634356-513201028496-513937500594-185e196ace562dd6443b5d29b1d817c2")
case("unlabelled", _NPS, NPR.format("slack"), "np.slack.6",
     "this is the api token to connect to the bot user\n\nxoxb-153445930147-Tjy11gGxUW6Cf99YOYwtzG0K\n",
     "Tjy11gGxUW6Cf99YOYwtzG0K")
case("unlabelled", _NPS, NPR.format("slack"), "np.slack.3",
     "#notifications_marcus: https://hooks.slack.com/services/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",
     "nzk0zace5iLKP35eWcfKE7JA")
case("unlabelled", _NPS, NPR.format("slack"), "np.slack.3",
     "// Import and Configure Console.Slack (Thanks David <3)\n// const slack = require('console-slack');\n// slack.options = {\n"
     '//   webhook : "https://hooks.slack.com/services/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",\n'
     '//   username: "console.slack.bot",\n//   emoji : ":trollface:",\n//   channel : "#payx-logs"\n// };\n',
     "NdQoKsZuvI1IDRace5wBljhI")
case("unlabelled", {**NP, "commit": "93085591ed21a78575ee0d8d920d657a4524ff3e"}, NPR.format("github"), "np.github.2",
     '    "url": "git+https://FelipeMestre:gho_psT9pqNFsehnc4se0ZzzR0HBxapxZD35hNHi@github.com/gontarz/PW_2021_Website-FelipeMestre.git"',
     "gho_psT9pqNFsehnc4se0ZzzR0HBxapxZD35hNHi")

# Nosey Parker's .netrc rule (a config file's credential, as ini-env's keys are)
_NPN = {**NP, "commit": "841be7191f3d10d473a1cd90a0e0707885616e0d"}
for _text, _secret in (("machine api.github.com login ziggy^stardust password 012345abcdef", "012345abcdef"),
                       ("```\nmachine raw.github.com\n  login visionmedia\n  password pass123\n```\n", "pass123"),
                       ('"""\nmachine api.wandb.ai\n  login user\n  password 7cc938e45e63e9014f88f811be240ba0395c02dd\n"""\n',
                        "7cc938e45e63e9014f88f811be240ba0395c02dd")):
    case("ini-env", _NPN, NPR.format("netrc"), "np.netrc.1", _text, _secret)


# -- issue 41, finding 3: the families that slipped through to every copy ---------------------------------
# Each was looked at while its rule was written, so every case of this round is dev (split="dev"), whatever
# its rule id would draw: the held-out part stays the 106 cases no rule was shaped by.
# A token with an invisible character inside (a chat client's zero width space, a soft hyphen, a word joiner;
# an escaped one in JSON): the public examples above, as pasted.
for _text, _secret, _form in (
        ("## git developer settings\nghp_ZJDeVREhkptGF7\u200bWvep0NwJWlPEQP7a0t2nxL\n", "Wvep0NwJWlPEQP7a0t2nxL", "zero-width-space"),
        ("github_pat_11AAOKYUI0JqmGpRMr5nGt_LiPrTSWAO\u00adOZZXUwkT9YLUT0fJE9Wh3EbPGXYisTF6w5NZKZJ4GJgZLTL7dK",
         "OZZXUwkT9YLUT0fJE9Wh3EbPGXYisTF6w5NZKZJ4GJgZLTL7dK", "soft-hyphen"),
        ('{"token": "ghp_ZJDeVREhkptGF7\\u200bWvep0NwJWlPEQP7a0t2nxL"}', "Wvep0NwJWlPEQP7a0t2nxL", "json-escaped-zero-width")):
    case("invisible", KF, K.format("github"), "kingfisher.github.1", _text, _secret, _form, split="dev")
case("invisible", _NPS, NPR.format("slack"), "np.slack.4",
     "python log_announce.py xoxp-513768634356-513201028496-\u2060513937500594-185e196ace562dd6443b5d29b1d817c2",
     "513937500594-185e196ace562dd6443b5d29b1d817c2", "word-joiner", split="dev")

# Twilio's account SID and auth token given to a client (Client('AC…', '…'), the helper libraries' first
# example): Kingfisher's twilio.1 SID and twilio.2 key, sarif-pattern-matcher's SEC101/018 pair
case("twilio", KF, K.format("twilio"), "kingfisher.twilio.1",
     "client = Client('AC712594f590c0d8ace55c04858f7398f9', 'Cd2Bd1dE1201aE2DFFEcfeBafCc3c31D')",
     "Cd2Bd1dE1201aE2DFFEcfeBafCc3c31D", "client-call", split="dev")
case("twilio", KF, K.format("twilio"), "kingfisher.twilio.1",
     "const client = require('twilio')('AC712594f590c0d8ace55c04858f7398f9', 'Cd2Bd1dE1201aE2DFFEcfeBafCc3c31D');",
     "AC712594f590c0d8ace55c04858f7398f9", "client-call", split="dev")
case("twilio", {**SPM, "commit": "c03753776e7b2f2aaa6ab4bdd8d95e2bfda0bce3"},
     SPMI.format("SEC101_018.TwilioCredentials"), "spm.SEC101_018.TwilioCredentials",
     'var client = new TwilioRestClient("AC11111111111111111111111111111111", "c9117d87046fc24205e4240e6bc9963a");',
     "c9117d87046fc24205e4240e6bc9963a", "client-call", split="dev")

# A password given on a command line, as each tool documents the option (no public rule set has these), with
# a plausible password (gitleaks' newPlausibleSecret, seeded by the option)
DOCS = {"commit": None, "licence": "documentation"}
for _repo, _path, _rule, _template in (
        ("Docker documentation", "reference/cli/docker/login (--password-stdin)", "docs.docker-login",
         "echo {} | docker login --username foo --password-stdin"),
        ("Docker documentation", "reference/cli/docker/login (--password-stdin)", "docs.docker-login",
         "echo '{}' | podman login quay.io -u foo --password-stdin"),
        ("sudo(8) manual", "-S, --stdin", "docs.sudo-stdin", "echo '{}' | sudo -S apt-get update"),
        ("sudo(8) manual", "-S, --stdin", "docs.sudo-stdin", 'sudo -S systemctl restart nginx <<< "{}"'),
        ("OpenSSH ssh-keygen(1) manual", "-N new_passphrase", "docs.ssh-keygen", "ssh-keygen -t ed25519 -N '{}' -f ~/.ssh/deploy"),
        ("OpenSSH ssh-keygen(1) manual", "-P passphrase", "docs.ssh-keygen", "ssh-keygen -p -P {} -N '' -f ~/.ssh/id_rsa"),
        ("7-Zip documentation", "cmdline/switches/password.htm (-p)", "docs.7z", "7z x b.7z -p{}"),
        ("7-Zip documentation", "cmdline/switches/password.htm (-p)", "docs.7z", '7z a -tzip -p"{}" -mem=AES256 out.zip dist'),
        ("Info-ZIP zip(1) manual", "-P password", "docs.zip", "zip -r -P {} release.zip build/"),
        ("Info-ZIP unzip(1) manual", "-P password", "docs.zip", "unzip -P '{}' release.zip"),
        ("JDK keytool documentation", "-srcstorepass, -deststorepass", "docs.keytool",
         "keytool -importkeystore -srckeystore old.p12 -srcstorepass {0} -destkeystore new.jks -deststorepass {0}"),
        ("JDK keytool documentation", "-storepass, -keypass", "docs.keytool",
         "keytool -genkeypair -alias app -keystore app.jks -storepass '{0}' -keypass '{0}'")):
    _secret = plausible(_AZ09 + "!#%+", 14, _rule + _template)
    case("command-line", {"repo": _repo, **DOCS}, _path, _rule, _template.format(_secret), _secret, "documented", split="dev")
# ConvertTo-SecureString -AsPlainText: sarif-pattern-matcher's SEC101/052 test inputs as written (its "666666",
# one repeated character, is a stand-in and left out) and PSScriptAnalyzer's rule documentation ("Wrong:")
_CTS = {**SPM, "commit": "f93a42e809a7de220223e999f563bb0bae20e29b"}
_CTSP, _CTSR = SPMI.format("SEC101_052.ConvertToSecureString"), "spm.SEC101_052.ConvertToSecureString"
for _text, _secret in (
        (' $PWord = ConvertTo-SecureString -String "doodle_BLOB0000" -AsPlainText -Force\n'
         " $Credential = New-Object -TypeName System.Management.Automation.PSCredential -ArgumentList $User, $PWord",
         "doodle_BLOB0000"),
        ("ConvertTo-SecureString -String 'Doodle$111111' -AsPlainText -Force PS C:\\&gt; Add-AzureRmServiceFabricNodeType "
         "-ResourceGroupName 'Group1' -Name 'someContosoCluster' -NodeType 'n2' -Capacity 5 -VmUserName 'someName' "
         "-VmPassword $pwd</dev:code>", "Doodle$111111"),
        ("ConvertTo-SecureString -String 'D00dle2222' -AsPlainText -Force))  #Set-TargetResource \"Present\" \"test\"",
         "D00dle2222"),
        ("ConvertTo-SecureString -String 'D$oodle3333' -AsPlainText -Force)  New-Mailbox -Organization url.com "
         "-Name \"serverName1\"  -WindowsLiveID \"email@address.domain.com\" -Password (ConvertTo-SecureString -String "
         "'D$oodle4444' -AsPlainText -Force)", "D$oodle4444"),
        ("ConvertTo-SecureString -String '6ood137777' -AsPlainText -Force))  #Set-TargetResource \"Present\"", "6ood137777")):
    case("command-line", _CTS, _CTSP, _CTSR, _text, _secret, split="dev")
_PSSA = {"repo": "PowerShell/PSScriptAnalyzer", "commit": "f759936964a85658c50c0eda9d3d307b34e1726b", "licence": "MIT"}
for _text, _secret in (('$notsecure = convertto-securestring "abc" -asplaintext -force', "abc"),
                       ('New-Object System.Management.Automation.PSCredential -ArgumentList "username", '
                        '(ConvertTo-SecureString "notsecure" -AsPlainText -Force)', "notsecure")):
    case("command-line", _PSSA, "RuleDocumentation/AvoidUsingConvertToSecureStringWithPlainTextNoViolations.md",
         "psscriptanalyzer.AvoidUsingConvertToSecureStringWithPlainText", _text, _secret, split="dev")

# Credentials in base64 of JSON: Docker Engine API's X-Registry-Auth header (base64url of {"username",
# "password", "email", "serveraddress"}) and a docker config.json's "auths" entry, with a plausible password
_XRA = plausible(_AZ09 + "!#%+", 14, "X-Registry-Auth")
_AUTH = base64.urlsafe_b64encode(json.dumps({"username": "foo", "password": _XRA, "email": "foo@example.com",
                                             "serveraddress": "registry.example.com"}).encode()).decode()
_PAIR = base64.b64encode(json.dumps({"username": "foo", "password": _XRA}).encode()).decode()
for _text, _secret, _form in ((f"X-Registry-Auth: {_AUTH}", _AUTH, "base64url"), (_PAIR, _PAIR, "base64")):
    case("base64-json", {"repo": "Docker Engine API documentation", **DOCS}, "Authentication (X-Registry-Auth)",
         "docs.x-registry-auth", _text, _secret, _form, split="dev")


def split(rule: str) -> str:
    return "dev" if zlib.crc32(rule.encode()) % 2 == 0 else "held-out"


def build() -> list[dict]:
    return [{**c, "split": c.get("split") or split(c["rule"])} for c in CASES]


def dumps(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


if __name__ == "__main__":
    text = dumps(build())
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text(encoding="utf-8") == text else 1)
    OUT.write_text(text, encoding="utf-8")
    print(f"{OUT}: {text.count(chr(10))} cases")
