"""The sources of data-fixtures/secret-examples.jsonl (python data-fixtures/secret_examples.py).

Transcribed from public rule sets, each rule with the repository, file, commit and licence it
was read from. Only what those files hold as examples is here: a rule's true positives (tp:
something in the text must be found) and false positives (fp: nothing is to be found by that
rule; another rule may still see a secret in some), as written (a string) or as the rule
generates them (S: gitleaks' GenerateSampleSecrets, all 32 file formats; S1: its
GenerateSampleSecret, one assignment; L: a line with drawn parts). X(regex) is gitleaks'
secrets.NewSecret(regex), P(regex) its newPlausibleSecret, AN/HEX/... its utils/patterns.go.

Left out: literal examples over 400 characters (three 1Password service-account tokens, a
DNA sequence), commented-out (TODO) examples, and detect-secrets cases that test file
handling (line numbers, filters) rather than a text.
"""

from __future__ import annotations

GITLEAKS = {"source": "gitleaks", "repo": "gitleaks/gitleaks", "licence": "MIT"}
DETECT_SECRETS = {"source": "detect-secrets", "repo": "Yelp/detect-secrets", "licence": "Apache-2.0"}
RULES: list[dict] = []


def rule(name: str, file: str, commit: str, tp=(), fp=(), base=GITLEAKS) -> None:
    path = f"cmd/generate/config/rules/{file}" if base is GITLEAKS else file
    RULES.append({**base, "rule": name, "path": path, "commit": commit, "tp": list(tp), "fp": list(fp)})


def X(regex: str) -> dict:
    return {"re": regex}


def P(regex: str) -> dict:
    return {"re": regex, "plausible": True}


def NUM(n) -> dict:
    return X(f"[0-9]{{{n}}}")


def HEX(n) -> dict:
    return X(f"[a-f0-9]{{{n}}}")


def AN(n) -> dict:
    return X(f"[a-z0-9]{{{n}}}")


def ANES(n) -> dict:  # AlphaNumericExtendedShort
    return X(f"[a-z0-9_-]{{{n}}}")


def ANE(n) -> dict:  # AlphaNumericExtended
    return X(f"[a-z0-9=_\\-]{{{n}}}")


def ANEL(n) -> dict:  # AlphaNumericExtendedLong
    return X(f"[a-z0-9\\/=_\\+\\-]{{{n}}}")


def HEX_UUID() -> dict:
    return X("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def S(ident: str, *parts) -> dict:
    return {"kind": "samples", "id": ident, "parts": list(parts)}


def S1(ident: str, *parts) -> dict:
    return {"kind": "sample", "id": ident, "parts": list(parts)}


def L(*parts) -> dict:
    return {"kind": "line", "parts": list(parts)}


# -- gitleaks ---------------------------------------------------------------------------------

rule("1password-service-account-token", "1password.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S1("1password", X(r"ops_eyJ[a-zA-Z0-9+/]{250,}={0,3}"))],
     fp=['''        login:
          serviceAccountToken:
            fn::secret: ops_eyJzaWduSW5B..[Redacted]''',
         ''': To start using this service account, run the following command:
:
: export OP_SERVICE_ACCOUNT_TOKEN=ops_eyJzaWduSW5BZGRyZXNzIjoiaHR0cHM6...''',
         "ops_eyJ" + "x" * 300])
rule("1password-secret-key", "1password.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("1password", X(r"A3-[A-Z0-9]{6}-[A-Z0-9]{11}-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}")),
         S("1password", X(r"A3-[A-Z0-9]{6}-[A-Z0-9]{6}-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}")),
         "A3-ASWWYB-798JRYLJVD4-23DC2-86TVM-H43EB", "A3-ASWWYB-798JRY-LJVD4-23DC2-86TVM-H43EB"],
     fp=["A3-XXXXXX-XXXXXXXXXXX-XXXXX-XXXXX-XXXXX", "A3-xXXXXX-XXXXXX-XXXXX-XXXXX-XXXXX-XXXXX"])
rule("adafruit-api-key", "adafruit.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3",
     tp=[S1("adafruit", ANES(32))])
rule("adobe-client-id", "adobe.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("adobe", HEX(32))])
rule("adobe-client-secret", "adobe.go", "07562da07355a496db154176d255b3b4d2bd9637",
     tp=[L('adobeClient := "p8e-', HEX(32), '"')])
rule("age-secret-key", "age.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("age", "AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ")])
rule("airtable-api-key", "airtable.go", "1b2977a5fb91ee2b00bc0618551648b79bd18a88", tp=[S("airtable", AN(17))])
rule("airtable-personnal-access-token", "airtable.go", "1b2977a5fb91ee2b00bc0618551648b79bd18a88",
     tp=[S("airtable", "pat", X(r"[a-z0-9]{14}\.[a-f0-9]{64}"))])
rule("algolia-api-key", "algolia.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3",
     tp=[L("algolia_key := ", HEX(32))])
rule("alibaba-access-key-id", "alibaba.go", "1337c8388c856eac133f4c5576514d413a407546",
     tp=[L('alibabaKey := "LTAI', HEX(20), '"')],
     fp=["https://mp.weixin.qq.com/s?__biz=ltAiJTIfmTcHF0Z3fohrsVLP&wx_header=1&scene=27#wechat_redirect)"])
rule("alibaba-secret-key", "alibaba.go", "1337c8388c856eac133f4c5576514d413a407546", tp=[S1("alibaba", AN(30))])
rule("anthropic-api-key", "anthropic.go", "71ab52c7c3bf6409baedfc07e67874855db54ced",
     tp=["sk-ant-api03-abc123xyz-456def789ghij-klmnopqrstuvwx-3456yza789bcde-1234fghijklmnopby56aaaogaopaaaabc123xyzAA",
         S1("anthropic", "sk-ant-api03-", ANES(93), "AA")])
rule("anthropic-admin-api-key", "anthropic.go", "71ab52c7c3bf6409baedfc07e67874855db54ced",
     tp=["sk-ant-admin01-abc12fake-456def789ghij-klmnopqrstuvwx-3456yza789bcde-12fakehijklmnopby56aaaogaopaaaabc123xyzAA",
         S1("anthropic", "sk-ant-admin01-", ANES(93), "AA")])
rule("anthropic-oauth-token", "anthropic.go", "71ab52c7c3bf6409baedfc07e67874855db54ced",
     tp=[S("anthropic", "sk-ant-oat01-", ANES(100))])
rule("anthropic-oauth-refresh-token", "anthropic.go", "71ab52c7c3bf6409baedfc07e67874855db54ced",
     tp=[S("anthropic", "sk-ant-ort01-", ANES(100))])
rule("atlassian-api-token", "atlassian.go", "2ce7c735f4083df6fcb67e301055d8b445f949e9",
     tp=[S1("atlassian", AN(24)), S1("confluence", AN(24))])
rule("aws-access-token", "aws.go", "0b3e675886829867703d7060b2451d0b7155db7d",
     tp=[S("AWS", "AKIALALEMEL33243OLIB"), S("AWS", "AKIA", X("[A-Z2-7]{16}")), S("AWS", "ASIA", X("[A-Z2-7]{16}")),
         S("AWS", "ABIA", X("[A-Z2-7]{16}")), S("AWS", "ACCA", X("[A-Z2-7]{16}"))],
     fp=["key = AKIAXXXXXXXXXXXXXXXX", "aws_access_key: AKIAIOSFODNN7EXAMPLE", 'msgstr "Näytä asiakirjamallikansio."',
         "TODAYINASIAASACKOFRICEFELLOVER"])
rule("azure-ad-client-secret", "azure.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=["client_secret=bP88Q~rcBcYjzzOhg1Hnn76Wm3jGgakZiZ.8vMgR",
         "client_secret=bP88Q~rcBcYjzzOhg1Hnn76Wm3jGgakZiZ.8vMgR\n",
         "client_secret: .IQ8Q~79R7TOWOspFnWcEG-dYt4KXqFqxK16cxr",
         "AUTH_CLIENTSECRET = _V28Q~IC8qxmlWNpHuDm34JlbKv9LXV5MvUR3a-P",
         '<value xsi:type="xsd:string">~Gg8Q~nVhlLi2vpg_nXBGqFsbGK-t~Hus1JmTa0y</value>',
         '"CLIENT_SECRET": "YYz7Q~Sudoqwap1PnzEBA3zqBK~i5uesDIv.C"',
         "Set-PSUAuthenticationMethod -Type 'OpenIDConnect' -CallbackPath '/auth/oidc' -ClientId 'fake' -ClientSecret '2Vq7Q~q5VgKljZ7cb3.0sp0Apz.vOjRIPyeTr'",
         'client-secret: "t028Q~-aLbmQuinnZtzbgtlEAYstnBWEmGPAoBm"',
         '"cas.authn.azure-active-directory.client-secret=qHF8Q~PCM5HhMoyTFc5TYEomnzR6Kim9UJhe8a.P",',
         r'"line": "client_srt = \"qpF8Q~PCM5MhMoyTFc5TYEomnYRUKim9UJhe8a2P\";",',
         "\"client_secret\":       acctest.Representation{RepType: acctest.Required, Create: 'dO29Q~F5-VwnW.lZdd11xFF_t5NAXCaGwDl9NbT1'},",
         "Example= GN.7Q~4AkLZBNEbz4Jxlm~O5G6SsyFxYg6zMR",
         '"the_value": "QtT8Q~9C-_Ij~RouHVpD2Tuf3oHWGh.DQ3kcjbAn"',
         "QtT8Q~9C-_Ij~RouHVpD2Tuf3oHWGh.DQ3kcjbAn",
         "(use the client secret: QtT8Q~9C-_Ij~RouHVpD2Tuf3oHWGh.DQ3kcjbAn)",
         "(QtT8Q~9C-_Ij~RouHVpD2Tuf3oHWGh.DQ3kcjbAn)",
         L(r'\"pass\": \"', X(r"[\w~.]{3}"), NUM(1), "Q~", X(r"[\w~.-]{31,34}"))],
     fp=["![图源：《深入拆解Tomcat & Jetty》](https://p3-juejin.byteimg.com/tos-cn-i-k3u1fbpfcp/6a9e704af49b4380bb686f0c96d33b81~tplv-k3u1fbpfcp-watermark.image)",
         "~" * 40, "~" * 43,
         ".ui.visible.right.sidebar~.ui.visible.left.sidebar~.pusher{transform:translate3d(0,0,0)}",
         'buf.WriteString("~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~\\n\\n::\\n\\n")',
         "'url': 'http://www.2doc.nl/speel~VARA_101375237~mh17-het-verdriet-van-nederland~.html',",
         '@ar = split("~", "965f1453~47~09414c93e4cef985416f472549220827da3ba6fed8ad28e29ef6ad170ad53a69051e9b06f439ef6da5df8670181f7eb2481650");',
         "'#!/registries/5/portainer.demo~2Fportainerregistrytesting~2Falpine',",
         r'+ "<Trust Comment=\"\" Identity=\"USK@u2vn3Lh6Kte2-TgBSNKorbsKkuAt34ckoLmgx0ndXO0,4~q8Q~3wIHjX9DT0yCNfQmr9oxmYrDZoQVLOdNg~yk0,AQACAAE/WebOfTrustRC2/2\" Value=\"100\"/>"',
         "client_secret=bP88Q~xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"])
rule("curl-auth-user", "curl.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=["curl --cacert ca.crt -u elastic:P@ssw0rd$1 https://localhost:9200",
         """sh-5.0$ curl -k -X POST https://infinispan:11222/rest/v2/caches/default/hello \\
  -H 'Content-type: text/plain' \\
  -d 'world' \\
  -u developer:yqDVtkqPECriaLRi""",
         'curl -u ":d2LkV78zLx!t" https://localhost:9200',
         'curl -u "d2LkV78zLx!t:" https://localhost:9200',
         "curl -sw '%{http_code}' -X POST --user  'johns:h0pk1ns~21s' $GItHUB_API_URL/$GIT_COMMIT --data",
         "curl --user roger23@gmail.com:pQ9wTxu4Fg https://www.dropbox.com/cli_link?host_id=abcdefg -v",
         """curl -s --user 'api:d2LkV78zLx!t' \\
    https://api.mailgun.net/v2/sandbox91d3515882ecfaa1c65be642.mailgun.org/messages""",
         'curl -s -v --user "j.smith:dB2yF6@qL9vZm1P#4J" "https://api.contoso.org/user/me"',
         'curl -X POST --user "{acd3c08b-74e8-4f44-a2d0-80694le24f46}":"{ZqL5kVrX1n8tA2}" --header "Accept: application/json" --data "{\\"text\\":\\"Hello, world\\",\\"source\\":\\"en\\",\\"target\\":\\"es\\"}" https://gateway.watsonplatform.net/language-translator/api',
         "curl --user kevin:'pRf7vG2h1L8nQkW9' -iX PATCH -H \"Content-Type: application/json\" -d",
         """$ curl https://api.dropbox.com/oauth2/token \\
  --user c28wlsosanujy2z:qgsnai0xokrw4j1 --data grant_type=authorization_code"""],
     fp=["curl -i -u 'test:test'", '   curl -sL --user "$1:$2" "$3" > "$4"',
         "curl -u <user:password> https://test.com/endpoint", "curl --user neo4j:[PASSWORD] http://[IP]:7474/db/data/",
         'curl -u "myusername" http://localhost:15130/api/check_user/', "curl -u username:token",
         'curl -u "${_username}:${_password}"', 'curl -u "${username}":"${password}"',
         'curl -k -X POST -I -u "SRVC_JENKINS:${APPID}"', 'curl -u ":" https://localhost:9200',
         "curl -sw '%{http_code}' -X POST --user '$USERNAME:$PASSWORD' $GItHUB_API_URL/$GIT_COMMIT --data",
         'curl --user "xxx:yyy"',
         '           curl -sL --user "$GITHUB_USERNAME:$GITHUB_PASSWORD" "$GITHUB_URL" > "$TESTS_PATH"',
         'curl --silent --fail {{- if and $.Values.username $.Values.password }} --user "{{ $.Values.username }}:{{ $.Values.password }}"',
         'curl -XGET -i -u "${{ env.ELK_ID }}:${{ build.env.ELK_PASS }}"',
         'curl -XGET -i -u "${{needs.vault.outputs.account_id}}:${{needs.vault.outputs.account_password}}"',
         'curl -XGET -i -u "${{ steps.vault.outputs.account_id }}:${{ steps.vault.outputs.account_password }}"',
         'curl -X POST --user "$(cat ./login.txt):$(cat ./password.txt)"',
         "curl http://127.0.0.1:5000/file --user user:pass --digest        # digest auth",
         '   curl -X GET --insecure --user "username:password" \\',
         "curl --silent --insecure --user ${f5user}:${f5pass} \\",
         'curl --insecure --ssl-reqd "smtps://smtp.gmail.com" --mail-from "src@gmail.com" --mail-rcpt "dst@gmail.com" --user "src@gmail.com" --upload-file out.txt'])
rule("curl-auth-header", "curl.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=["curl --header  'Authorization:  5eb4223e-5008-46e5-be67-c7b8f2732305'",
         "curl -H 'Authorization: Basic YnJvd3Nlcjo=' \\",
         'curl -k -X POST --header "Authorization: Basic djJlNEpYa0NJUHZ5a2FWT0VRXzRqZmZUdDkwYTp2emNBZGFzZWpmlWZiUDc2VUJjNDNNVDExclVh" "https://api-qa.example.com:8243/token" -d "grant_type=client_credentials"',
         """curl -X POST -H "Content-Type: application/json" \\
 -H "Authorization: Basic MzUzYjMwMmM0NDU3NGY1NjUwNDU2ODdlNTM0ZTdkNmE6Mjg2OTI0Njk3ZTYxNWE2NzJhNjQ2YTQ5MzU0NTY0NmM=" \\
  -d '{"user":{"emailAddress":"test@example.com"}, "password":"password"}' \\
  'http://localhost:8080/oauth2-provider/v1.0/users'""",
         """#curl -X POST \\
#  https://api.mailgun.net/v3/sandbox7dbcabccd4314c123e8b23599d35f5b6.mailgun.org/messages \\
#  -H 'Authorization: Basic YXBpOmtleS1hN2MzNDJ3MzNhNWQxLTU2M2U3MjlwLTZhYjI3YzYzNzM0Ng==' \\
#  -F from='Excited User <mailgun@sandbox7dbc123bccd4314c0aae8b23599d35f5b6.mailgun.org>' \\
#  -F to='joe@example.com' \\
#  -F subject='Hello' \\
#  -F text='Testing some Mailgun awesomness!'""",
         '# curl -X GET "http://localhost:3000/api/cron/status" -H "Authorization: Bearer cfcabd11c7ed9a41b1a3e063c32d5114"',
         """curl https://api.openai.com/v1/chat/completions \\
  -H "Content-Type: application/json" \\
  -H "Authorization: Bearer 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" \\""",
         """curl -X GET "https://api.cloudflare.com/client/v4/user/tokens/verify" \\
     -H "Authorization: Bearer _FXNljbSRYMWx3TWrd7lgKhLtVZX6iskC8Wcbb4b" \\
     -H "Content-Type:application/json\"""",
         'curl -H "Authorization: Bearer sha256~bRLFnzd59Z3XpZH5_seJPHALOuvbWiKwbFKSsoALkgp"',
         'curl -H "Authorization: Api-Token 22cb987851bc5659l29114c62e60c79abd0d2c08" --request PUT https://appsecclass.report/api/use/635',
         'curl -H "Authorization: Token 22cb987851bc5659229114c62e60c79abd0d2c08" --request PUT https://appsecclass.report/api/use/635',
         'curl -L -H "Authorization:eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJjb25maWRlbmNlIjowLjh9.kvRPfjAhLhtRTczoRgctVGp7KY1QVH3UBZM-gM0x8ec" service1.local -> correct jwt ',
         'curl -L -H "Authorization: sha256~bRLFnzd5@=-.a+/hgdS"',
         """curl -X GET \\
     -H "apikey: c4ed6c21-9dd5-4a05-8e3f-c56d1151cce8" \\
     -H "Accept: application/json" \\""",
         'curl -X POST --header "Api-Token: Sk94HG7f6KB"',
         'curl -XPOST http://localhost:8080/api/tasks -H "Content-Type: application/x-www-form-urlencoded; charset=UTF-8" -H "Token: 3fea6af1349166ea" -d "content=hello-curl"',
         """curl -X GET https://octopus.corp.net/
     -H "X-Octopus-ApiKey: 3a16750d-d363-41a4-8ebd-035408f7730f" \\"""],
     fp=['curl https://example.com/micropub -d h=entry -d "content=Hello World" -H "Authorization: Bearer XXXXXXXXXXXX"',
         'curl -X POST https://accounts.spotify.com/api/token -d grant_type=client_credentials --header "Authorization: Basic ..."',
         """curl \\
  -H "Authorization: Bearer <Openverse API token>" \\
  "https://api.openverse.org/v1/audio/?q=test\"""",
         """curl -v -v -v -X POST https://domain/api/v1/authentication/sso/login-url/ \\
  -H 'Content-Type: application/json' \\
  -H "Authorization: Token **********" \\
  -d '{"username": "test", "next": "/luna/"}'""",
         'curl -XPOST http://localhost:8080/api/token -H "Authorization: basic {base64(email:password[\\n])}" => token',
         """curl -X GET \\
     -H "apikey: $API_KEY" \\
     -H "Accept: $FORMAT" \\
"$API_URL/rest/v1/stats_derniere_labellisation\"""",
         'curl -X GET -H "Content-Type: application/json" -H "Authorization: Bearer $(gcloud auth print-access-token)" https://workflowexecutions.googleapis.com/v1/projects/244283331594/locations/us-central1/workflows/sample-workflow/executions/43c925aa-514a-44c1-a0a4-a9f8f26fd2cb/callbacks/1705791f-d446-4e92-a6d0-a13622422e80_31864a51-8c13-4b03-ad4d-945cdc8d0631'])
rule("generic-api-key", "generic.go", "81fc668f98e21eb044ec9646283137022d82e669",
     tp=[S("generic", "CLOJARS_34bf0e88955ff5a1c328d6a7491acc4f48e865a7b8dd4d70a70749037443"),
         S("generic", "Zf3D0LXCM3EIMbgJpUNnkRtOfOueHznB"),
         "'access_token': 'eyJ0eXAioiJKV1slS3oASx=='",
         L('some_api_token_123 = "', P("[a-zA-Z0-9]{60}"), '"'),
         '"user_auth": "am9obmRvZTpkMDY5NGIxYi1jMTcxLTQ4ODYt+TMyYS0wMmUwOWQ1/mIwNjc="',
         '"credentials" : "0afae57f3ccfd9d7f5767067bc48b30f719e271ba470488056e37ab35d4b6506"',
         L("creds = ", P("[a-zA-Z0-9]{30}")),
         L("private-key: ", P(r"[a-zA-Z0-9\-_.=]{100}")),
         L("passwd = ", P(r"[a-zA-Z0-9\-_.=]{30}")),
         '"client_secret" : "6da89121079f83b2eb6acccf8219ea982c3d79bccc3e9c6a85856480661f8fde",',
         L("mySecretString=", P("[a-zA-Z0-9]{30}")),
         L("todo_secret_do_not_commit = ", P("[a-zA-Z0-9]{30}")),
         ' utils.GetEnvOrDefault("api_token", "dafa7817-e246-48f3-91a7-e87653d587b8")'],
     fp=['"accessor":"rA1wk0Y45YCufyfq",', "report_access_id: e8e4df51-2054-49b0-ab1c-516ac95c691d",
         'accessibilityYesOptionId = "0736f5ef-7e88-499a-80cc-90c85d2a5180"',
         "_RandomAccessIterator>\n_LIBCPP_CONSTEXPR_AFTER_CXX11 ",
         'this.ultraPictureBox1.Name = "ultraPictureBox1";', "rapidstring:marm64-uwp=fail",
         "event-bus-message-api:rc0.15.0_20231217_1420-SNAPSHOT'",
         "COMMUNICATION_API_VERSION=rc0.13.0_20230412_0712-SNAPSHOT",
         "MantleAPI_version=9a038989604e8da62ecddbe2094b16ce1b778be1",
         "[DEBUG]\t\torg.slf4j.slf4j-api:jar:1.7.8.:compile (version managed from default)",
         "[DEBUG]\t\torg.neo4j.neo4j-graphdb-api:jar:3.5.12:test", "apiUrl=apigee.corpint.com",
         'X-API-Name": "NRG0-Hermes-INTERNAL-API",',
         'author = "james.fake@ymail.com",', "X-MS-Exchange-Organization-AuthSource: sm02915.int.contoso.com",
         "Authentication-Results: 5h.ca.iphmx.com",
         "withCredentials([usernamePassword(credentialsId: '29f63271-dc2f-4734-8221-5b31b5169bac', usernameVariable: 'USERNAME', passwordVariable: 'PASSWORD')]) {",
         "credentialsId: 'ff083f76-7804-4ef1-80e4-fe975bb9141b'", "jobCredentialsId: 'f4aeb6bc-2a25-458a-8111-9be9e502c0e7'",
         '  "credentialId": "B9mTcFSck2LzJO2S3ols63",', 'environment {\n\tCREDENTIALS_ID = "K8S_CRED"\n}',
         "dev.credentials.url=dev-lb1.api.f4ke.com:5215",
         'keyword: "Befaehigung_P2"', 'public_key = "9Cnzj4p4WGeKLs1Pt8QuKUpRKfFLfRYC9AIKjbJTWit"',
         "pub const X509_pubkey_st = struct_X509_pubkey_st;", "|| pIdxKey->default_rc==0", "monkeys-audio:mx64-uwp=fail",
         L("primaryKey=", P(r"[a-zA-Z0-9\-_.=]{30}")), L("foreignKey=", P(r"[a-zA-Z0-9\-_.=]{30}")),
         L("key_down_event=", P(r"[a-zA-Z0-9\-_.=]{30}")), L("issuerKeyHash=", P(r"[a-zA-Z0-9\-_.=]{30}")),
         '<entry key="jetbrains.mps.v8_elimination" value="executed" />', "minisat-master-keying:x64-uwp=fail",
         "IceSSL.KeyFile=s_rsa1024_priv.pem", '"bucket_key": "SalesResults-1.2"',
         '<key tag="SecurityIdentifier" name="SecurityIdentifier" type="STRING" />', "schemaKey = 'DOC_Vector_5_32'",
         'sequenceKey = "18"', "app.keystore.file=env/cert.p12", "-DKEYTAB_FILE=/tmp/app.keytab",
         "\tdoc.Security.KeySize = PdfEncryptionKeySize.Key128Bit;", "o.keySelector=n,o.haKey=!1,",
         '                                "key_name": "prod5zyxlmy-cmk",',
         '                                "kms_key_id": "555ea4a3-d53a-4412-9c66-3a7cb667b0d6",',
         '\t"key_vault_name": "web21prqodx24021",', "  keyVaultToStoreSecrets: cmp2-qat-1208358310",
         ',apiKey:"6fe4476ee5a1832882e326b506d14126",', 'const validKeyChars = "0123456789abcdefghijklmnopqrstuvwxyz_-."',
         'const keyStr = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"',
         "key_length = XSalsa20.key_length",
         'pub const SN_id_Gost28147_89_None_KeyMeshing = "id-Gost28147-89-None-KeyMeshing"',
         "KeyPair = X25519.KeyPair", "BlindKeySignatures = Ed25519.BlindKeySignatures",
         'AVEncVideoMaxKeyframeDistance, "2987123a-ba93-4704-b489-ec1e5f25292c"', "            keyPressed = kVK_Return.u16",
         'timezone_mapping = {\n    "Turkey Standard Time": "Europe/Istanbul",\n}',
         "password combination.\n\nR5: Regulatory--21", "PuttyPassword=0",
         'LLM_SECRET_NAME = "NEXUS-GPT4-API-KEY"', "  <UserSecretsId>79a3edd0-2092-40a2-a04d-dcb46d5ca9ed</UserSecretsId>",
         "secret_length = X25519.secret_length", "secretSize must be >= XXH3_SECRET_SIZE_MIN",
         "# get build time secret for authentication\n#RUN --mount=type=secret,id=jfrog_secret \\\n#    JFROG_SECRET = $(cat /run/secrets/jfrog_secret) && \\",
         "    access_token_url='https://github.com/login/oauth/access_token',",
         'publicToken = "9Cnzj4p4WGeKLs1Pt8QuKUpRKfFLfRYC9AIKjbJTWit"',
         '<SourceFile SourceLocation="F:\\Extracts\\" TokenFile="RTL_INST_CODE.cer">',
         'notes            = "Maven - io.jsonwebtoken:jjwt-jackson-0.11.2"',
         "csrf-token=Mj2qykJO5rELyHgezQ69nzUX0i3OH67V7+V4eUrLfpuyOuxmiW9rhROG/Whikle15syazJOkrjJa3U2AbhIvUw==",
         'clientId = "73082700-1f09-405b-80d0-3131bfd6272d"', "GITHUB_API_KEY=\nDYNATRACE_API_KEY=",
         "snowflake.password=\njdbc.snowflake.url=",
         "import { chain_Anvil1_Key, chain_Anvil2_Key } from '../blockchain-tests/pallets/supported-chains/consts';",
         'SRCREV_moby = "43fc912ef59a83054ea7f6706df4d53a7dea4d80"',
         'LIC_FILES_CHKSUM = "file://${WORKDIR}/license.html;md5=5c94767cedb5d6987c902ac850ded2c6"'])
rule("grafana-api-key", "grafana.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("grafana-api-key", "eyJrIjoi", AN(70))])
rule("grafana-cloud-api-token", "grafana.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("grafana-cloud-api-token", "glc_", AN(32)), S1("grafana-cloud-api-token", "glc_", AN(32)),
         "loki_key: glc_eyJvIjoiNzQ0NTg3IiwibiI7InN0YWlrLTQ3NTgzMC1obC13cml0ZS1oYW5kc29uJG9raSIsImsiOiI4M2w3cmdYUlBoMTUyMW1lMU023nl5UDUiLCJtIjp7IOIiOiJ1cyJ9fQ=="],
     fp=["glc_" + "x" * 68, '   API_KEY="glc_111111111111111111111111111111111111111111="',
         "static void GLC_CreateLightmapTextureArray(void);\nstatic void GLC_CreateLightmapTexturesIndividual(void);\n\nvoid GLC_UploadLightmap(int textureUnit, int lightmapnum);",
         "// Alias models\nvoid GLC_StateBeginUnderwaterAliasModelCaustics(texture_ref base_texture, texture_ref caustics_texture)\n{"])
rule("grafana-service-account-token", "grafana.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("grafana-service-account-token", "glsa_", AN(32), "_", HEX(8)),
         "'Authorization': 'Bearer glsa_pITqMOBIfNH2KL4PkXJqmTyQl0D9QGxF_486f63e1'"],
     fp=["glsa_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX_AAAAAAAA"])
rule("artifactory-api-key", "artifactory.go", "2cd7fd66ef47b1299a0eee852fc5e8b0f4bcbee2",
     tp=[L('artifactoryApiKey := "AKCp', HEX(69), '"')])
rule("artifactory-reference-token", "artifactory.go", "2cd7fd66ef47b1299a0eee852fc5e8b0f4bcbee2",
     tp=[L('artifactoryRefToken := "cmVmd', HEX(59), '"')])
rule("asana-client-id", "asana.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("asana", NUM(16))])
rule("asana-client-secret", "asana.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("asana", AN(32))])
rule("authress-service-client-access-key", "authress.go", "01e60c81e6e35aa9a9b47a9659808b8b1cce2f28",
     tp=[S1("authress", X(r"sc_[a-z0-9]{10}\.[a-z0-9]{4}\.acc_[a-z0-9]{10}\.[a-z0-9_-]{40}"))])
rule("beamer-api-token", "beamer.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("beamer", "b_", ANE(44))],
     fp=["│   ├── R21A-A-V010SP13RC181024R16900-CN-B_250K-Release-OTA-97B6C6C59241976086FABDC41472150C.bfu"])
rule("bitbucket-client-id", "bitbucket.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d", tp=[S1("bitbucket", AN(32))])
rule("bitbucket-client-secret", "bitbucket.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d",
     tp=[S1("bitbucket", AN(64))])
rule("clojars-api-token", "clojars.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("clojars", "CLOJARS_", AN(60))])
_CF_GLOBAL = ['cloudflare_global_api_key = "d3d1443e0adc9c24564c6c5676d679d47e2ca"',
              "CLOUDFLARE_GLOBAL_API_KEY: 674538c7ecac77d064958a04a83d9e9db068c",
              'cloudflare: "0574b9f43978174cc2cb9a1068681225433c4"']
_CF_API = ['cloudflare_api_key = "Bu0rrK-lerk6y0Suqo1qSqlDDajOk61wZchCkje4"',
           "CLOUDFLARE_API_KEY: 5oK0U90ME14yU6CVxV90crvfqVlNH2wRKBwcLWDc",
           'cloudflare: "oj9Yoyq0zmOyWmPPob1aoY5YSNNuJ0fbZSOURBlX"']
_CF_CA = ["CLOUDFLARE_ORIGIN_CA: v1.0-aaa334dc886f30631ba0a610-0d98ef66290d7e50aac7c27b5986c99e6f3f1084c881d8ac0eae5de1d1aa0644076ff57022069b3237d19afe60ad045f207ef2b16387ee37b749441b2ae2e9ebe5b4606e846475d4a5",
          "CLOUDFLARE_ORIGIN_CA: v1.0-15d20c7fccb4234ac5cdd756-d5c2630d1b606535cf9320ae7456b090e0896cec64169a92fae4e931ab0f72f111b2e4ffed5b2bb40f6fba6b2214df23b188a23693d59ce3fb0d28f7e89a2206d98271b002dac695ed"]
# Each Cloudflare rule lists the other two's keys as its false positives (they are secrets of
# another kind); only the rule's own true positives are kept here.
rule("cloudflare-global-api-key", "cloudflare.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("cloudflare", HEX(37)), *_CF_GLOBAL])
rule("cloudflare-api-key", "cloudflare.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("cloudflare", ANES(40)), *_CF_API])
rule("cloudflare-origin-ca-key", "cloudflare.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("cloudflare", _CF_CA[0].split(": ")[1]), *_CF_CA])
rule("database-password", "database.go", "acf4df7dfb4cc2aca71ed8b1f57da83ebc8216e2",
     tp=[S("DB_PASSWORD", X(r"[a-zA-Z0-9:;<@=},!$?^]{20}")), S("db_password", X(r"[a-zA-Z0-9:;<@=},!$?^]{6}")),
         S("DB_PASSWD", X(r"[a-zA-Z0-9:;<@=},!$?^]{10}")), S("$DB_PASSWD", X(r"[a-zA-Z0-9:;<@=},!$?^]{15}")),
         S("$DB_PASSWORD", X(r"[a-zA-Z0-9:;<@=},!$?^]{50}")),
         L("pwd = ", X(r"[a-zA-Z0-9:;<@=},!$?^]{20}")), L("pwd: ", X(r"[a-zA-Z0-9:;<@=},!$?^]{50}"))],
     fp=["DB_PASSWORD=[value]", "somepwd=XXXXXXXXXXXXXXX"])
rule("databricks-api-token", "databricks.go", "07562da07355a496db154176d255b3b4d2bd9637",
     tp=[S1("databricks", "dapi", HEX(32))])
rule("digitalocean-pat", "digitalocean.go", "2f4d5fffc8d90eea0a91be6c8882ca9fa3f2f418", tp=[S("do", "dop_v1_", HEX(64))])
rule("digitalocean-access-token", "digitalocean.go", "2f4d5fffc8d90eea0a91be6c8882ca9fa3f2f418",
     tp=[S("do", "doo_v1_", HEX(64))])
rule("digitalocean-refresh-token", "digitalocean.go", "2f4d5fffc8d90eea0a91be6c8882ca9fa3f2f418",
     tp=[S("do", "dor_v1_", HEX(64))])
rule("discord-api-token", "discord.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5", tp=[S("discord", HEX(64))])
rule("discord-client-id", "discord.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5", tp=[S("discord", NUM(18))],
     fp=["discord=000000000000000000"])
rule("discord-client-secret", "discord.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5", tp=[S("discord", NUM(32))],
     fp=["discord=00000000000000000000000000000000"])
# This version's sample is a package constant (sampleAlphaNumeric43Token); drawn here from its regex.
rule("doppler-api-token", "doppler.go", "2423dff4e9d1cb149332b4c5e18e43483f7d76b8",
     tp=[S1("doppler", "dp.pt.", AN(43))])
rule("gcp-api-key", "gcp.go", "0073de5a24273e92d30afb5dac07f3a7d600c9d2",
     tp=[S("gcp", X(r"AIza[\w-]{35}")), "AIzaSyNHxIf32IQ1a1yjl3ZJIqKZqzLAK1XhDk-"],
     fp=["GWw4hjABFzZCGiRpmlDyDdo87Jn9BN9THUA47muVRNunLxsa82tMAdvmrhOqNkRKiYMEAFbTJAIzaTesb6Tscfcni8vIpWZqNCXFDFslJtVSvFDq",
         "AIzaTesb6Tscfcni8vIpWZqNCXFDFslJtVSvFDqabcd123", 'apiKey: "AIzaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"',
         "AIZASYCO2CXRMC9ELSKLHLHRMBSWDEVEDZTLO2O"])
rule("github-pat", "github.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("github", "ghp_", AN(36))])
rule("github-oauth", "github.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("github", "gho_", AN(36))])
rule("github-app-token", "github.go", "07562da07355a496db154176d255b3b4d2bd9637",
     tp=[S1("github", "ghu_", AN(36)), S1("github", "ghs_", AN(36))])
rule("github-refresh-token", "github.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("github", "ghr_", AN(36))])
_GL = "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5"
rule("gitlab-cicd-job-token", "gitlab.go", _GL, tp=[S("gitlab", "glcbt-", AN(5), "_", AN(20))])
rule("gitlab-deploy-token", "gitlab.go", _GL, tp=[S1("gitlab", "gldt-", AN(20))])
rule("gitlab-feature-flag-client-token", "gitlab.go", _GL, tp=[S("gitlab", "glffct-", AN(20))])
rule("gitlab-feed-token", "gitlab.go", _GL, tp=[S("gitlab", "glft-", AN(20))])
rule("gitlab-incoming-mail-token", "gitlab.go", _GL, tp=[S("gitlab", "glimt-", AN(25))])
rule("gitlab-kubernetes-agent-token", "gitlab.go", _GL, tp=[S("gitlab", "glagent-", AN(50))])
rule("gitlab-oauth-app-secret", "gitlab.go", _GL, tp=[S("gitlab", "gloas-", AN(64))])
rule("gitlab-pat", "gitlab.go", _GL, tp=[S("gitlab", "glpat-", AN(20))], fp=["glpat-XXXXXXXXXXX-XXXXXXXX"])
rule("gitlab-pat-routable", "gitlab.go", _GL, tp=[S("gitlab", "glpat-", AN(27), ".", AN(2), AN(7))],
     fp=["glpat-xxxxxxxx-xxxxxxxxxxxxxxxxxx.xxxxxxxxx"])
rule("gitlab-ptt", "gitlab.go", _GL, tp=[S("gitlab", "glptt-", HEX(40))], fp=["glptt-" + "x" * 40])
rule("gitlab-rrt", "gitlab.go", _GL, tp=[S("gitlab", "GR1348941", AN(20))],
     fp=["GR134894112312312312312312312", "GR1348941XXXXXXXXXXXXXXXXXXXX"])
rule("gitlab-runner-authentication-token", "gitlab.go", _GL, tp=[S("gitlab", "glrt-", AN(20))])
rule("gitlab-runner-authentication-token-routable", "gitlab.go", _GL,
     tp=[S("gitlab", "glrt-t", NUM(1), "_", AN(27), ".", AN(2), AN(7))],
     fp=["glrt-tx_xxxxxxxxxxxxxxxxxxxxxxxxxxx.xxxxxxxxx"])
rule("gitlab-scim-token", "gitlab.go", _GL, tp=[S("gitlab", "glsoat-", AN(20))])
rule("gitlab-session-cookie", "gitlab.go", _GL, tp=[S("gitlab", "_gitlab_session=", AN(32))])
rule("groq-api-key", "groq.go", "90039844123c1cd7831d55edf468633415730f17", tp=[S("groq", "gsk_", AN(48))],
     fp=["GSK_API_KEY=gsk_" + "x" * 48])
rule("harness-api-key", "harness.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3",
     tp=[S1("harness", "pat.", AN(22), ".", AN(24), ".", AN(20)), S1("harness", "sat.", AN(22), ".", AN(24), ".", AN(20))])
rule("hashicorp-tf-api-token", "hashicorp.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("hashicorpToken", HEX(14), ".atlasv1.", ANE("60,70")),
         '#token = "hE1hlYILrSqpqh.atlasv1.ARjZuyzl33F71WR55s6ln5GQ1HWIwTDDH3MiRjz7OnpCfaCb1RCF5zGaSncCWmJdcYA"'],
     fp=['token        = "xxxxxxxxxxxxxx.atlasv1.' + "x" * 67 + '"'])
rule("hashicorp-tf-password", "hashicorp.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=['administrator_login_password = "thisIsDog11"', 'password       = "rootpasswd"'],
     fp=["administrator_login_password = var.db_password", 'password = "${aws_db_instance.default.password}"'])
rule("heroku-api-key", "heroku.go", "072b5fe7af46e3dfe574361967d96ec3bcb428bc",
     tp=['const HEROKU_KEY = "63866443-cb87-446f-8bf0-80e9be787301"', 'heroku_api_key = "832d2129-a846-4e27-99f4-7004b6ad53ef"'],
     fp=['const HEROKU_KEY = "12345678-ABCD-ABCD-ABCD-1234567890AB"'])
rule("heroku-api-key-v2", "heroku.go", "072b5fe7af46e3dfe574361967d96ec3bcb428bc",
     tp=[S("heroku", X(r"HRKU-AA[0-9a-zA-Z_-]{58}")),
         'const KEY = "HRKU-AAlQ1aVoHDujJ9QsDHdHlHO0hbzhoERRSO45ZQusSYHg_____w4_hLrAym_u""',
         'API_Key = "HRKU-AAy9Ppr_HD2pPuTyIiTYInO0hbzhoERRSO93ZQusSYHgaD7_WQ07FnF7L9FX"'])
rule("huggingface-access-token", "huggingface.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("huggingface", "hf_", X("[a-zA-Z]{34}")),
         "huggingface-cli login --token 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",
         "huggingface-cli login --token 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",
         "huggingface-cli login --token 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",
         "huggingface-cli login --token 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",
         "huggingface-cli login --token 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",
         "huggingface-cli login --token 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",
         "huggingface-cli login --token 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",
         "huggingface-cli login --token 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",
         '-H "Authorization: Bearer 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"',
         "DEV=1 HF_TOKEN=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 poetry run python app.py",
         "use_auth_token='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')",
         'CI_HUB_USER_TOKEN = "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"',
         "- Change line 5 and add your Hugging Face token, that is, instead of 'hf_token = \"ADD_YOUR_HUGGING_FACE_TOKEN_HERE\"', you will need to change it to something like'hf_token = \"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\"'",
         '# Not critical, only usable on the sandboxed CI instance.\n\t\tTOKEN = "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"',
         '    parser.add_argument("--hf_token", type=str, default=\'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\', help="Hugging Face Access Token to access PyAnnote gated models")'],
     fp=["- (id)hf_requiredCharacteristicTypesForDisplayMetadata;",
         'amazon.de#@#div[data-cel-widget="desktop-rhf_SponsoredProductsRemoteRHFSearchEXPSubsK2ClickPagination"]',
         "                            _kHMSymptomhf_generatedByHomeAppForDebuggingPurposesKey,",
         "    #define OSCHF_DebugGetExpectedAverageCrystalAmplitude NOROM_OSCHF_DebugGetExpectedAverageCrystalAmplitude",
         "  M_UINT       (ServingCellPriorityParametersDescription_t,  H_PRIO,  2, &hf_servingcellpriorityparametersdescription_h_prio),",
         "                    change_dir(cwd)\n\t\tsubdirs = glob.glob('HF_CAASIMULIAComputeServicesBuildTime.HF*.Linux64')\n\t\tif len(subdirs) == 1:",
         '        os.environ.get("HF_AUTH_TOKEN",\n\t\t"hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),',
         "# HuggingFace API Token https://huggingface.co/settings/tokens\n\t\tHUGGINGFACE_API_TOKEN=hf_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx,"])
rule("huggingface-organization-api-token", "huggingface.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("huggingface", "api_org_", X("[a-zA-Z]{34}")),
         "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", "`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`",
         "\\'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'\\",
         'def test_private_space(self):\n        hf_token = "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"  # Intentionally revealing this key for testing purposes\n        io = gr.load(',
         'hf_token = "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"  # Intentionally revealing this key for testing purposes',
         '"news_train_dataset = datasets.load_dataset(\'nlpHakdang/aihub-news30k\',  data_files = \\"train_news_text.csv\\", use_auth_token=\'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\')\\n",',
         "os.environ['HUGGINGFACEHUB_API_TOKEN'] = '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'",
         L("api_org_", X("[a-zA-Z]{34}"))],
     fp=['public static final String API_ORG_EXIST = "APIOrganizationExist";',
         "const api_org_controller = require('../../controllers/api/index').organizations;",
         'API_ORG_CREATE("https://qyapi.weixin.qq.com/cgi-bin/department/create?access_token=ACCESS_TOKEN"),',
         'def test_internal_api_org_inclusion_with_href(api_name, href, expected, monkeypatch, called_with):\n\t\tmonkeypatch.setattr("requests.sessions.Session.request", called_with)',
         "<p>You should see a token <code>hf_xxxxx</code> (old tokens are <code>api_XXXXXXXX</code> or <code>api_org_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX</code>).</p>"])
rule("jwt", "jwt.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d",
     tp=["JWT := eyJhbGciOieeeiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwic3ViZSI6IjEyMzQ1Njc4OTAiLCJuYW1lZWEiOiJKb2huIERvZSIsInN1ZmV3YWZiIjoiMTIzNDU2Nzg5MCIsIm5hbWVmZWF3ZnciOiJKb2huIERvZSIsIm5hbWVhZmV3ZmEiOiJKb2huIERvZSIsInN1ZndhZndlYWIiOiIxMjM0NTY3ODkwIiwibmFtZWZ3YWYiOiJKb2huIERvZSIsInN1YmZ3YWYiOiIxMjM0NTY3ODkwIiwibmFtZndhZSI6IkpvaG4gRG9lIiwiaWZ3YWZhYXQiOjE1MTYyMzkwMjJ9.a_5icKBDo-8EjUlrfvz2k2k-FYaindQ0DEYNrlsnRG0"])
rule("kubernetes-secret-yaml", "kubernetes.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3",
     tp=['\napiVersion: v1\nkind: Secret\nmetadata:\n  name: heketi-secret\n  namespace: default\ndata:\n  # base64 encoded password. E.g.: echo -n "mypassword" | base64\n  key: bXlwYXNzd29yZA==',
         "apiVersion: v1\n data:\n \textra: YWRtaW46cGFzc3dvcmQ=\n kind: secret\n metadata:\n\t name: secret-sa-sample\n\t annotations:\n\t \tkubernetes.io/service-account.name: 'sa-name'",
         "apiVersion: v1\ndata:\n\tpassword: UyFCXCpkJHpEc2I9\n\tusername: YWRtaW4=\nkind: Secret\nmetadata:\n\tcreationTimestamp: '2022-06-28T17:44:13Z'\n\tname: db-user-pass\n\tnamespace: default\ntype: Opaque",
         "apiVersion: 'v1'\ndata:\n\textra: 'YWRtaW46cGFzc3dvcmQ='\nkind: 'Secret'\nmetadata:\n\tname: 'secret-sa-sample'\n\tannotations:\n\t\tkubernetes.io/service-account.name: 'sa-name'",
         "apiVersion: v1\ndata:\n  .dockercfg: |\n    eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo=\nmetadata:\n  name: secret-dockercfg\ntype: kubernetes.io/dockercfg\nkind: Secret\n",
         "apiVersion: v1\nkind: secret\ndata:\n\textra: YWRtaW46cGFzc3dvcmQ=\nmetadata:\n\tname: secret-sa-sample\n\tannotations:\n\t\tkubernetes.io/service-account.name: 'sa-name'",
         "apiVersion: v1\nkind: Secret\nmetadata:\n\tcreationTimestamp: '2022-06-28T17:44:13Z'\n\tname: db-user-pass\n\tnamespace: default\ntype: Opaque\ndata:\n\t# the data is abbreviated in this example\n\tpassword: UyFCXCpkJHpEc2I9\n\tusername: YWRtaW4=\n",
         'apiVersion: "v1"\nkind: "Secret"\ndata:\n\tpassword: "UyFCXCpkJHpEc2I9"\n\tusername: "YWRtaW4="\nmetadata:\n\tname: "db-user-pass"\n\tnamespace: "default"\ntype: "Opaque"',
         "apiVersion: v1\nkind: Secret\nmetadata:\n  name: secret-dockercfg\ntype: kubernetes.io/dockercfg\ndata:\n  .dockercfg: >\n    eyJhdXRocyI6eyJodHRwczovL2V4YW1wbGUvdjEvIjp7ImF1dGgiOiJvcGVuc2VzYW1lIn19fQo="],
     fp=["apiVersion: v1            \nkind: Secret              \nmetadata:                 \n  name: registry-auth-data\ntype: Opaque              \ndata:                     \n  htpasswd: ''\n",
         "apiVersion: v1            \nkind: Secret              \nmetadata:                 \n  name: registry-auth-data\ntype: Opaque              \ndata:                     \n  htpasswd: {{ htpasswd }}\n---                       \napiVersion: v1            \n                          kind: ReplicationController",
         "apiVersion: v1\ndata:\n\textra: YmFyCg==\nkind: secret\nmetadata:\n\tname: secret-sa-sample\n\tannotations:\n\t\tkubernetes.io/service-account.name: 'sa-name'",
         "apiVersion: v1\n data:\n \tpassword: {{ .Values.Password }}\n kind: secret\n metadata:\n \tname: secret-sa-sample\n \tannotations:\n \t\tkubernetes.io/service-account.name: 'sa-name'",
         "apiVersion: 'kubernetes-client.io/v1'\nmetadata:\n  name: actions-exporter\n  namespace: github-actions-exporter\nspec:\n  backendType: secretsManager\n  data:\n    - key: MySecretManagerKey\n      name: github_token\n      property: github_token\nkind: ExternalSecret\n",
         "apiVersion: external-secrets.io/v1beta1\nkind: ExternalSecret\nmetadata:\n  name: api-key\n  namespace: my-namespace\nspec:\n  secretStoreRef:\n    kind: ClusterSecretStore\n    name: aws-secretsmanager\n  refreshInterval: 1h\n  target:\n    creationPolicy: Owner\n  data:\n    - secretKey: api-key\n      remoteRef:\n        key: my-secrets-manager-secret"])
rule("linear-api-key", "linear.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("linear", "lin_api_", AN(40))])
rule("linear-client-secret", "linear.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("linear", HEX(32))])
rule("vault-service-token", "hashicorp_vault.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S1("vault", X(r"s\.[0-9][a-zA-Z0-9]{23}")), "token: s.ZC9Ecf4M5g9o34Q6RkzGsj0z",
         S1("vault", X(r"hvs\.[0-9][\w\-]{89}")),
         '-vaultToken hvs.CAESIP2jTxc9S2K7Z6CtcFWQv7-044m_oSsxnPE1H3nF89l3GiYKHGh2cy5sQmlIZVNyTWJNcDRsYWJpQjlhYjVlb1cQh6PL8wEYAg"'],
     fp=["  credentials: new AWS.SharedIniFileCredentials({ profile: '<YOUR_PROFILE>' })",
         "INFO 4 --- [           main] o.s.b.f.s.DefaultListableBeanFactory     : Overriding bean definition for bean",
         "s.xxxxxxxxxxxxxxxxxxxxxxxx", "s.THISSTRINGISALLUPPERCASE", "s.thisstringisalllowercase",
         "s.AcceptanceTimeoutSeconds ", "s.makeKubeConfigController = args", "hvs." + "x" * 98])
rule("vault-batch-token", "hashicorp_vault.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("vault", "hvb.", ANES(138)),
         "hvb.AAAAAQJgxDgqsGNorpoOR7hPZ5SU-ynBvCl764jyRP_fnX7WvkdkDzGjbLNGdPdtlY33Als2P36yDZueqzfdGw9RsaTeaYXSH7E4RYSWuRoQ9YRKIw8o7mDDY2ZcT3KOB7RwtW1w1FN2eDqcy_sbCjXPaM1iBVH-mqMSYRmRd2nb5D1SJPeBzIYRqSglLc31wUGN7xEzyrKUczqOKsIcybQA"])
rule("aws-secret-access-key", "aws_secret.go", "48fede00bad94a20bf6f69714cfd99b87bce6fe1",
     tp=[S("AWSSecret", "lbqlNh3FW5/3AwnBoWsYIJam9w2Us4ZOH5Un8RyR")])
rule("PKCS8-PK", "PKCS8.go", "32fb6035f9951d85e5f28cad2c854148cc01b42b", tp=["-----BEGIN PRIVATE KEY-----"])
rule("ansible-vault-token", "ansible.go", "036cc72ee61c8bbcc712e271c74f80204172848b",
     tp=[S1("ansible-vault-token", "ANSIBLE_VAULT;1.0;AES256;\n", NUM(32))])
# The adyen, braintree and chargebee rules' false positives (a random token under a *Token name,
# in another vendor's shape) are left out: they hold a token by any other rule's measure.
rule("adyen-api-key", "adyen.go", "6894f11b2e096b9c08e91ec3aa55c1f9ba31fdd7", tp=[S("adyen", "AQEyhmfx.", ANE(60))])
rule("adyen-client-key", "adyen.go", "6894f11b2e096b9c08e91ec3aa55c1f9ba31fdd7", tp=[S("adyen", "test_", AN(34))])
rule("bittrex-access-key", "bittrex.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3", tp=[S1("bittrex", AN(32))])
rule("bittrex-secret-key", "bittrex.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3", tp=[S1("bittrex", AN(32))])
rule("braintree-access-token", "braintree.go", "4bf5a8fff4cb8e82fc0835006382cd5bfdca45e8",
     tp=[S("braintree", "access_token$sandbox$", AN(16)), S("braintree", "access_token$production$", AN(16))])
rule("braintree-tokenization-key", "braintree.go", "4bf5a8fff4cb8e82fc0835006382cd5bfdca45e8",
     tp=[S("braintree", "sandbox_", AN(8), "_", AN(16)), S("braintree", "production_", AN(8), "_", AN(16))])
rule("castai-api-key", "castai.go", "964e684ade126a682790d659c27cda0207562c14",
     tp=[S("CastAI", "castai_v1_2cb5a70064f60ba2f5507bcbb02938a5a0483bf2a9742d08c5c274c827c9f6ea_aabb92b5"),
         S("CastAI", "castai_v1_", X("[A-Za-z0-9]{64}_[A-Za-z0-9]{8}"))],
     fp=["key = test_v1_2cb5a70064f60ba2f5507bcbb02938a5a0483bf2a9742d08c5c274c827c9f6ea_037192b5"])
rule("chargebee-access-token", "chargebee.go", "23fc48da57f66fd189a2f76f5e8a8e96817bf725",
     tp=[L('chargebeeToken := "test_', AN(32), '"')])
rule("chieftools-pat", "chieftools.go", "a605611d95c5a4af8ee1fbbcee6612a8148ea4ba", tp=[S1("chieftools", "ctp_", AN(36))])
rule("chieftools-access-token", "chieftools.go", "a605611d95c5a4af8ee1fbbcee6612a8148ea4ba",
     tp=[S1("chieftools", "cto_", AN(36))])
rule("chieftools-refresh-token", "chieftools.go", "a605611d95c5a4af8ee1fbbcee6612a8148ea4ba",
     tp=[S1("chieftools", "ctr_", AN(36))])
rule("claude-code-session-url", "claude.go", "a1305fe9ab0b886c63aeac15e82ccecd91878c74",
     tp=["https://claude.ai/code/session_01DDpXdCk8uhiRdzku123456", "http://claude.ai/code/session_01DDpXdCk8uhiRdzku123456",
         "see https://claude.ai/code/session_01DDpXdCk8uhiRdzku123456 for context",
         'session = "https://claude.ai/code/session_01DDpXdCk8uhiRdzku123456"',
         "https://CLAUDE.AI/code/session_01DDpXdCk8uhiRdzku123456", "https://claude.ai/code/session_01DDpXdCk8uhiRdzku123456/",
         "https://claude.ai/code/session_01DDpXdCk8uhiRdzku123456?ref=foo",
         L("https://claude.ai/code/session_", X("[A-Za-z0-9]{24}"))],
     fp=["https://example.com/code/session_01DDpXdCk8uhiRdzku123456", "https://claude.ai/chat/session_01DDpXdCk8uhiRdzku123456",
         "https://claude.ai/code/01DDpXdCk8uhiRdzku123456", "https://claude.ai/code/session_short"])
rule("clickhouse-cloud-api-secret-key", "clickhouse.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("ClickHouse", "4b1dbRdW3rOcB7xLthrM4BTBGK1qPLkHigpN1bXD6z"), S("ClickHouse", "4b1d", X("[A-Za-z0-9]{38}"))],
     fp=["key = 4b1dXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"])
rule("codecov-access-token", "codecov.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("codecov", AN(32))])
rule("cohere-api-token", "cohere.go", "9dbd2a489b7fca6f57121fd178e2c54e7cba227b",
     tp=[S1("cohere", X("[a-zA-Z0-9]{40}")), L("export CO_API_KEY=", X("[a-zA-Z0-9]{40}"))],
     fp=["CO_API_KEY=" + "x" * 40])
rule("coinbase-access-token", "coinbase.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d", tp=[S1("coinbase", ANES(64))])
rule("confluent-secret-key", "confluent.go", "18283bb48e7b422fe8198addb3c91f86f820e798", tp=[S1("confluent", AN(64))])
rule("confluent-access-token", "confluent.go", "18283bb48e7b422fe8198addb3c91f86f820e798", tp=[S1("confluent", AN(16))])
rule("contentful-delivery-api-token", "contentful.go", "07562da07355a496db154176d255b3b4d2bd9637",
     tp=[S1("contentful", AN(43))])
rule("datadog-access-token", "datadog.go", "08ce2e6cd607feab71492fb5744c965e34c51e0a", tp=[S1("datadog", AN(40))])
rule("defined-networking-api-token", "definednetworking.go", "3991984afa19ecc6aafd9955e31c9c26277e37d8",
     tp=[S1("dnkey", "dnkey-", ANE(26), "-", ANE(52))])
rule("django-insecure-secret-key", "django.go", "bb18c6d9a0c3c9e8873dc6774989a9b8e297bb8d",
     tp=['SECRET_KEY = "django-insecure-123456789!%_&*^)abcdef"'])
rule("droneci-access-token", "droneci.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("droneci", AN(32))])
rule("dropbox-api-token", "dropbox.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3", tp=[S1("dropbox", AN(15))])
rule("duffel-api-token", "duffel.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("duffel", "duffel_test_", ANE(43))])
rule("dynatrace-api-token", "dynatrace.go", "11f513a09cda5cace3190f0fb2ac37d70ce9cfd4",
     tp=[S("dynatrace", "dt0c01.", AN(24), ".", AN(64))])
rule("easypost-api-token", "easypost.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("EZAK", "EZAK", X("[a-zA-Z0-9]{54}")), L("EZAK", X("[a-zA-Z0-9]{54}")),
         L("example.com?t=EZAK", X("[a-zA-Z0-9]{54}"), "&q=1")])
rule("easypost-test-api-token", "easypost.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("EZTK", X("EZTK[a-zA-Z0-9]{54}")), L(X("EZTK[a-zA-Z0-9]{54}")), L("EZTK", X("[a-zA-Z0-9]{54}")),
         L("example.com?t=EZTK", X("[a-zA-Z0-9]{54}"), "&q=1")])
rule("etsy-access-token", "etsy.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d", tp=[S1("etsy", AN(24))])
rule("facebook", "facebook.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("facebook", HEX(32))])
rule("fastly-api-token", "fastly.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("fastly", ANE(32))])
# This version's samples are package constants (sampleAlphaNumeric20Token, sampleHex32Token); drawn here.
rule("finicity-client-secret", "finicity.go", "2423dff4e9d1cb149332b4c5e18e43483f7d76b8", tp=[S1("finicity", AN(20))])
rule("finicity-api-token", "finicity.go", "2423dff4e9d1cb149332b4c5e18e43483f7d76b8", tp=[S1("finicity", HEX(32))])
rule("finnhub-access-token", "finnhub.go", "18283bb48e7b422fe8198addb3c91f86f820e798", tp=[S1("finnhub", AN(20))])
rule("flickr-access-token", "flickr.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d", tp=[S1("flickr", AN(32))])
rule("flutterwave-public-key", "flutterwave.go", "07562da07355a496db154176d255b3b4d2bd9637",
     tp=[S1("flutterwavePubKey", "FLWPUBK_TEST-", HEX(32), "-X"), S1("flutterwavePubKey", "FLWSECK_TEST-", HEX(32), "-X"),
         S1("flutterwavePubKey", "FLWSECK_TEST-", HEX(12))])
rule("flyio-access-token", "flyio.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3",
     tp=[S1("fly", X(r"fo1_[\w-]{43}")), "Fly access token: fo1_8rz-j7r2eqJ2U7affEOO3HJN0j63DInyog3eV-glQSc\n",
         "=" * 109 + "\n\nfo1_BtKlzvfztw0M2hlLgTdsfPgDFiwM2jJjQXXy6I2pjuQ\nfly deploy",
         S1("fly", X(r"fm1[ar]_[a-zA-Z0-9+\/]{100,}={0,3}")), S1("fly", X(r"fm2_[a-zA-Z0-9+\/]{100,}={0,3}")),
         '"BindToParentToken": "FlyV1 fm2_lJPEEKnzKy0lkwV3B+WIlmrdwejEEFv5qmevHU4fMs+2Gr6oOiPC2SAyOTc0NWI4ZmJlNjBlNjJmZTgzNTkxOThhZWE4MjY0M5IMxAMBAgPEIH7VG8u74KwO62hmx8SZO8WaU5o1g3W2IVc7QN6T1VTr",'],
     fp=['resource "doppler_integration_flyio" "prod" {\n  name    = "TF Fly.io"\n  api_key = "fo1_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"\n}',
         "pub const MINIDUMP_SYSMEMINFO1_PERF_CCTOTALDIRTYPAGES_CCDIRTYPAGETHRESHOLD: u32 = 4u32;"])
rule("frameio-api-token", "frameio.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5", tp=[S("frameio", "fio-u-", ANE(64))])
rule("freemius-secret-key", "freemius.go", "11f513a09cda5cace3190f0fb2ac37d70ce9cfd4",
     tp=['$config = array(\n\t\t\t"secret_key" => "sk_ubb4yN3mzqGR2x8#P7r5&@*xC$utE",\n\t\t);'])
rule("freshbooks-access-token", "freshbooks.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5", tp=[S("freshbooks", AN(64))])
rule("gitter-access-token", "gitter.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3", tp=[S1("gitter", ANES(40))])
rule("gocardless-api-token", "gocardless.go", "18283bb48e7b422fe8198addb3c91f86f820e798",
     tp=[S1("gocardless", "live_", ANE(40))])
rule("hubspot-api-key", "hubspot.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3",
     tp=['const hubspotKey = "12345678-ABCD-ABCD-ABCD-1234567890AB"'])
rule("infracost-api-token", "infracost.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("ico", "ico-", X("[A-Za-z0-9]{32}")),
         '  variable {\n    name = "INFRACOST_API_KEY"\n    secret_value = "ico-mlCr1Mn3SRcRiZMObUZOTHLcgtH2Lpgt"\n    is_secret = true\n  }'],
     fp=["ico-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
         "http://assets.r7.com/assets/media_box_tv_tres_colunas/video_box.ico-7a388b69018576d24b59331fd60aab0c.png",
         "https://explosivelab.notion.site/Pianificazione-Nerdz-Ng-pubblico-1bc826ecc0994dd8915be97fc3489cde?pvs=74",
         "http://ece252-2.uwaterloo.ca:2540/image?q=gAAAAABdHkoqb9ZaJ3q4dlzEvTgG9WYwKcD9Aw7OUXeFicO-5M5IdNDjHBpKw7KBK3nCVqtuga4yzUaFEpJn8BqA1LzZprIJBw=="])
rule("intercom-api-key", "intercom.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3", tp=[S1("intercom", ANE(60))])
rule("intra42-client-secret", "intra42.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[L('clientSecret := "s-s4t2ud-', HEX(64), '"'), L('clientSecret := "s-s4t2af-', HEX(64), '"'),
         "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",
         "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"])
rule("jfrog-api-key", "jfrog.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[L("--set imagePullSecretJfrog.password=", AN(73))])
rule("jfrog-identity-token", "jfrog.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("jfrog", AN(64)), S("artifactory", AN(64)), S("bintray", AN(64)), S("xray", AN(64)),
         L('"artifactory", "', AN(64), '"')])
rule("kraken-access-token", "kraken.go", "18283bb48e7b422fe8198addb3c91f86f820e798", tp=[S1("kraken", ANEL("80,90"))])
rule("kucoin-access-token", "kucoin.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d", tp=[S1("kucoin", HEX(24))])
rule("kucoin-secret-key", "kucoin.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d", tp=[S1("kucoin", HEX_UUID())])
rule("langsmith-api-key", "langsmith.go", "a650223f5e6868cd2fc201a839facd81c0417cb6",
     tp=[S1("langsmith", "lsv2_pt_", AN(32), "_", AN(10)), S1("langchain", "lsv2_sk_", AN(32), "_", AN(10)),
         L("LANGCHAIN_API_KEY=lsv2_pt_", AN(32), "_", AN(10))],
     fp=["lsv2_xx_0123456789abcdef0123456789abcdef_0123456789"])
rule("launchdarkly-access-token", "launchdarkly.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("launchdarkly", ANE(40))])
rule("linkedin-client-id", "linkedin.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("linkedin", AN(14))])
rule("linkedin-client-secret", "linkedin.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("linkedin", AN(16))])
rule("lob-pub-api-key", "lob.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("lob", "test_pub_", HEX(31))])
rule("lob-api-key", "lob.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("lob", "test_", HEX(35))])
rule("looker-client-id", "looker.go", "6698291dffefeed95b07ae21ff31ffcd48131593", tp=[S("looker", AN(20))])
rule("looker-client-secret", "looker.go", "6698291dffefeed95b07ae21ff31ffcd48131593", tp=[S("looker", AN(24))])
rule("mailchimp-api-key", "mailchimp.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("mailchimp", HEX(32), "-us20")])
rule("mailgun-private-api-token", "mailgun.go", "1337c8388c856eac133f4c5576514d413a407546",
     tp=[S1("mailgun", "key-", HEX(32))])
rule("mailgun-pub-key", "mailgun.go", "1337c8388c856eac133f4c5576514d413a407546", tp=[S1("mailgun", "pubkey-", HEX(32))])
rule("mailgun-signing-key", "mailgun.go", "1337c8388c856eac133f4c5576514d413a407546",
     tp=[S1("mailgun", HEX(32), "-00001111-22223333")])
# This version's samples are package constants (sampleAlphaNumeric60Token, ...22Token); drawn here.
rule("mapbox-api-token", "mapbox.go", "2423dff4e9d1cb149332b4c5e18e43483f7d76b8", tp=[S1("mapbox", "pk.", AN(60), ".", AN(22))])
rule("mattermost-access-token", "mattermost.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d", tp=[S1("mattermost", AN(26))])
rule("maxmind-license-key", "maxmind.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("maxmind", "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")])
rule("messagebird-api-token", "messagebird.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("messagebird", AN(25)), S("message-bird", AN(25)), S("message_bird", AN(25))])
rule("messagebird-client-id", "messagebird.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("MessageBird", "12345678-ABCD-ABCD-ABCD-1234567890AB"),
         'const MessageBirdClientID = "12345678-ABCD-ABCD-ABCD-1234567890AB"'])
rule("netlify-access-token", "netlify.go", "18283bb48e7b422fe8198addb3c91f86f820e798", tp=[S1("netlify", ANE("40,46"))])
rule("new-relic-user-api-key", "newrelic.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("new-relic", "NRAK-", AN(27))])
rule("new-relic-user-api-id", "newrelic.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("new-relic", AN(64))])
rule("new-relic-browser-api-token", "newrelic.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("new-relic", "NRJS-", HEX(19))])
rule("new-relic-insert-key", "newrelic.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("new-relic", "NRII-", HEX(32))])
rule("npm-access-token", "npm.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("npmAccessToken", "npm_", AN(36))])
rule("nuget-config-password", "nuget.go", "1e2e01449c892d0ba2dbee15da664464abf50482",
     tp=['<add key="Password" value="CleartextPassword1" />', '<add key="ClearTextPassword" value="CleartextPassword1" />',
         '<add key="ClearTextPassword" value="TestSourcePassword" />', '<add key="ClearTextPassword" value="TestSource-Password" />',
         '<add key="ClearTextPassword" value="TestSource%Password" />', '<add key="ClearTextPassword" value="TestSource%Password%" />'],
     fp=['<add key="ClearTextPassword" value="XXXXXXXXXXX" />', '<add key="ClearTextPassword" value="abc" />',
         '<add key="ClearTextPassword" value="%TestSourcePassword%" />'])
rule("nytimes-access-token", "nytimes.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5", tp=[S("nytimes", AN(32))])
rule("octopus-deploy-api-key", "octopusdeploy.go", "2f4d5fffc8d90eea0a91be6c8882ca9fa3f2f418",
     tp=[S1("octopus", X("API-[A-Z0-9]{26}")), 'set apikey="API-ZNRMR7SL6L3ATMOIK7GKJDKLPY"'],
     fp=['msgstr "GSSAPI-VIRHEKAPSELOINTIMERKKIJONO."',
         "https://sonarcloud.io/api/project_badges/measure?project=Garden-Coin_API-CalculadoraDeInvestimentos&metric=alert_status",
         "https://fog-ringer-f42.notion.site/API-BD80F56CDC1441E6BF6011AB6D852875",
         '<iframe src="./archive/gifs/api-c99e353f761d318322c853c03e.gif"> </iframe>'])
rule("okta-access-token", "okta.go", "18283bb48e7b422fe8198addb3c91f86f820e798", tp=[S1("okta", AN(42))])
rule("openai-api-key", "openai.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("openaiApiKey", "sk-", AN(20), "T3BlbkFJ", AN(20)),
         "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",
         "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",
         "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",
         "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",
         "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",
         "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",
         "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",
         "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",
         "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"])
rule("openshift-user-token", "openshift.go", "11f513a09cda5cace3190f0fb2ac37d70ce9cfd4",
     tp=[S("oc", X(r"sha256~[\w-]{43}")), "Authorization: Bearer sha256~kV46hPnEYhCWFnB85r5NrprAxggzgb6GOeLbgcKNsH0",
         "oc login --token=sha256~ZBMKw9VAayhdnyANaHvjJeXDiGwA7Fsr5gtLKj3-eh- ", L("sha256~", X(r"[\w-]{43}"))],
     fp=['--set kraken.kubeconfig.token.token="sha256~XXXXXXXXXX_PUT_YOUR_TOKEN_HERE_XXXXXXXXXXXX" \\',
         "oc login --token=sha256~_xxxxxx_xxxxxxxxxxxxxxxxxxxxxx-xxxxxxxxxx-X \\\n    --server=https://api.${zone}.appuio.cloud:6443"])
rule("perplexity-api-key", "perplexity.go", "13ecdc136c8ce34a9800ee67d014328062d040cd",
     tp=[S("perplexity", "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'")],
     fp=["PERPLEXITY_API_KEY=pplx-" + "x" * 48])
rule("plaid-client-id", "plaid.go", "08ce2e6cd607feab71492fb5744c965e34c51e0a", tp=[S1("plaid", AN(24))])
rule("plaid-api-secret", "plaid.go", "08ce2e6cd607feab71492fb5744c965e34c51e0a", tp=[S1("plaid", AN(30))])
for _kind in ("pw", "tkn", "oauth"):
    rule(f"planetscale-{ {'pw': 'password', 'tkn': 'api-token', 'oauth': 'oauth-token'}[_kind] }", "planetscale.go",
         "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
         tp=[S("planetScale", f"pscale_{_kind}_", ANE(n)) for n in (32, 43, 64)])
rule("postman-api-token", "postman.go", "07562da07355a496db154176d255b3b4d2bd9637",
     tp=[S1("postmanAPItoken", "PMAK-", HEX(24), "-", HEX(34))])
rule("prefect-api-token", "prefect.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5", tp=[S("api-token", "pnu_", AN(36))],
     fp=['PREFECT_API_KEY = "pnu_XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"'])
rule("privateai-api-token", "privateai.go", "00bb82153ec981f5cd84b12f1486ec4cbb4289ed", tp=[S1("privateai", AN(32))],
     fp=['const privateaiToken = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";'])
rule("private-key", "privatekey.go", "00639b2ad719a17dab59de304b839b4a30ab05e3",
     tp=["-----BEGIN PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAVwAAAAdzc2gtcnNhAAAAAwEAAQAAAEEAqPfgaTEWEP3S9w0tgsicURfo+nLW09/0KfOPinhYZ4ouzU+3xC4plEp8Ut9FgL0AgqNslNaK34Kq+NZjO9DAQAAATB+9/CSfvfwkgAAAAdzc2gtcnNhAAAAQQCo9+BpMRYQ/dL3DS2CyJxRF+j6ctbT3/Qp84+KeFhnii7NT7fELilKUSnxS30WAvQCCo2yU1orfgqr41mM70MBAAAAAwEAAQAAAEAgkuLEHLaqkWhLgNKagSajeobLS3rPT0Agm0f7k55FXVt743hwNgkp98bMNrzy9AQ1mJGbQZGrpr4c8ZAx3aRNAAAAIBOs/5OiPgoTdSy7bcF9IGpSE8ZgGKzgYQVZeN97YE00AAAAIQCjEr8yAZ54u6Lfzkontk5iS2OEsE0AHr18rBNkWxQ2HQAAACEBCUEaRQnMnbp79mxDXDf6AU0cN/RPBjb9qSHDcWZHGzUAAAAXcGhwc2VjbGliLWdlbmVyYXRlZC1rZXkBAgME\n-----END PRIVATE KEY-----",
         "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8QuKUpRKfFLfRYC9AIKjbJTWit+CqvjWYzvQwECAwEAAQJAIJLixBy2qpFoS4DSmoEmo3qGy0t6z09AIJtH+5OeRV1be+N4cDYJKffGzDa88vQENZiRm0GRq6a+HPGQMd2kTQIhAKMSvzIBnni7ot/OSie2TmJLY4SwTQAevXysE2RbFDYdAiEBCUEaRQnMnbp79mxDXDf6AU0cN/RPBjb9qSHDcWZHGzUCIG2Es59z8ugGrDY+pxLQnwfotadxd+Uyv/Ow5T0q5gIJAiEAyS4RaI9YG8EWx/2w0T67ZUVAw8eOMB6BIUg0Xcu+3okCIBOs/5OiPgoTdSy7bcF9IGpSE8ZgGKzgYQVZeN97Y==\n-----END RSA PRIVATE KEY-----\n"])
rule("private-key-non-pem-format", "privatekey.go", "00639b2ad719a17dab59de304b839b4a30ab05e3",
     tp=["MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8QuKUpRKfFLfRYC9AIKjbJTWit+CqvjWYzvQwECAwEAAQJAIJLixBy2qpFoS4DSmoEmo3qGy0t6z09AIJtH+5OeRV1be+N4cDYJKffGzDa88vQENZiRm0GRq6a+HPGQMd2kTQIhAKMSvzIBnni7ot/OSie2TmJLY4SwTQAevXysE2RbFDYdAiEBCUEaRQnMnbp79mxDXDf6AU0cN/RPBjb9qSHDcWZHGzUCIG2Es59z8ugGrDY+pxLQnwfotadxd+Uyv/Ow5T0q5gIJAiEAyS4RaI9YG8EWx/2w0T67ZUVAw8eOMB6BIUg0Xcu+3okCIBOs/5OiPgoTdSy7bcF9IGpSE8ZgGKzgYQVZeN97Y=="])
rule("pulumi-api-token", "pulumi.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("pulumi-api-token", "pul-", HEX(40))])
rule("pypi-upload-token", "pypi.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=[S("pypi", "pypi-AgEIcHlwaS5vcmc", HEX(32), HEX(32))])
rule("rapidapi-access-token", "rapidapi.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5", tp=[S("rapidapi", ANES(50))])
rule("readme-api-token", "readme.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("api-token", "rdme_", AN(70))],
     fp=["const API_KEY = 'rdme_" + "X" * 70 + "';"])
rule("rubygems-api-token", "rubygems.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("rubygemsAPIToken", "rubygems_", HEX(48))])
rule("scalingo-api-token", "scalingo.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("scalingo", "tk-us-", ANES(48)), 'scalingo_api_token = "tk-us-loys7ib9yrxcys_ta2sq85mjar6lgcsspkd9x61s7h5epf_-"'])
rule("sendbird-access-token", "sendbird.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("sendbird", HEX(40))])
rule("sendbird-access-id", "sendbird.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("sendbird", HEX_UUID())])
rule("sendgrid-api-token", "sendgrid.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d",
     tp=[S1("sengridAPIToken", "SG.", ANE(66))])
rule("sendinblue-api-token", "sendinblue.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("sendinblue", "xkeysib-", HEX(64), "-", AN(16))])
rule("sentry-access-token", "sentry.go", "08ce2e6cd607feab71492fb5744c965e34c51e0a", tp=[S1("sentry", HEX(64))])
rule("shippo-api-token", "shippo.go", "07562da07355a496db154176d255b3b4d2bd9637",
     tp=[S1("shippo", "shippo_live_", HEX(40)), S1("shippo", "shippo_test_", HEX(40))])
for _p in ("shpss", "shpat", "shpca", "shppa"):
    rule(f"shopify-{_p}", "shopify.go", "1a23fa94d4aa9fd9f883b246b4d61688896837d5", tp=[S("shopify", f"{_p}_", HEX(32))])
rule("sidekiq-secret", "sidekiq.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d",
     tp=["BUNDLE_ENTERPRISE__CONTRIBSYS__COM: cafebabe:deadbeef", "export BUNDLE_ENTERPRISE__CONTRIBSYS__COM=cafebabe:deadbeef",
         "export BUNDLE_ENTERPRISE__CONTRIBSYS__COM = cafebabe:deadbeef", 'BUNDLE_GEMS__CONTRIBSYS__COM: "cafebabe:deadbeef"',
         'export BUNDLE_GEMS__CONTRIBSYS__COM="cafebabe:deadbeef"', 'export BUNDLE_GEMS__CONTRIBSYS__COM = "cafebabe:deadbeef"',
         "export BUNDLE_ENTERPRISE__CONTRIBSYS__COM=cafebabe:deadbeef;",
         "export BUNDLE_ENTERPRISE__CONTRIBSYS__COM=cafebabe:deadbeef && echo 'hello world'"])
rule("sidekiq-sensitive-url", "sidekiq.go", "08c6d3cf5924853ef6039b7a73091359bc22e00d",
     tp=["https://cafebabe:deadbeef@gems.contribsys.com/", "https://cafebabe:deadbeef@gems.contribsys.com",
         "https://cafeb4b3:d3adb33f@enterprise.contribsys.com/", "https://cafeb4b3:d3adb33f@enterprise.contribsys.com",
         "http://cafebabe:deadbeef@gems.contribsys.com/", "http://cafebabe:deadbeef@gems.contribsys.com",
         "http://cafeb4b3:d3adb33f@enterprise.contribsys.com/", "http://cafeb4b3:d3adb33f@enterprise.contribsys.com",
         "http://cafeb4b3:d3adb33f@enterprise.contribsys.com#heading1",
         "http://cafeb4b3:d3adb33f@enterprise.contribsys.com?param1=true&param2=false",
         "http://cafeb4b3:d3adb33f@enterprise.contribsys.com:80",
         "http://cafeb4b3:d3adb33f@enterprise.contribsys.com:80/path?param1=true&param2=false#heading1"])
_SL = "02788fb5ec7f20b962f5e01437f4baacbca3e8fa"
rule("slack-bot-token", "slack.go", _SL,
     tp=[S("bot", "xoxb-781236542736-2364535789652-GkwFDQoHqzXDVsC6GzqYUypD"),
         '"bot_token1": "xoxb-781236542736-2364535789652-GkwFDQoHqzXDVsC6GzqYUypD"',
         '"bot_token2": "xoxb-263594206564-2343594206574-FGqddMF8t08v8N7Oq4i57vs1MBS"',
         '"bot_token3": "xoxb-4614724432022-5152386766518-O5WzjWGLG0wcCm2WPrjEmnys"',
         L('"bot_token4": "xoxb-', NUM(13), "-", NUM(12), "-", AN(24), '"')],
     fp=["xoxb-xxxxxxxxx-xxxxxxxxxx-xxxxxxxxxxxx", "xoxb-xxx", "xoxb-12345-abcd234", "xoxb-xoxb-my-bot-token"])
rule("slack-user-token", "slack.go", _SL,
     tp=[S("user", "xoxp-41684372915-1320496754-45609968301-e708ba56e1517a99f6b5fb07349476ef"),
         '"user_token1": "xoxp-41684372915-1320496754-45609968301-e708ba56e1517a99f6b5fb07349476ef"',
         '"user_token2": "xoxp-283316862324-298911817009-298923149681-44f585044dace54f5701618e97cd1c0b"',
         '"user_token3": "xoxp-11873098179-111402824422-234336993777-b96c9fb3b69f82ebb79d12f280779de1"',
         '"user_token4": "xoxp-254112160503-252950188691-252375361712-6cbf56aada30951a9d310a5f23d032a0"',
         '"user_token5": "xoxp-4614724432022-4621207627011-5182682871568-1ddad9823e8528ad0f4944dfa3c6fc6c"',
         L('"user_token6": "xoxp-', NUM(12), "-", NUM(13), "-", NUM(13), "-", AN(32), '"'),
         r'"url_private": "https:\/\/files.slack.com\/files-pri\/T04MCQMEXQ9-F04MAA1PKE3\/image.png?t=xoxe-4726837507825-4848681849303-4856614048758-e0b1f3d4cb371f92260edb0d9444d206"'],
     fp=["https://docs.google.com/document/d/1W7KCxOxP-1Fy5EyF2lbJGE2WuKmu5v0suYqoHas1jRM", '"token1": "xoxp-1234567890"',
         '"token2": "xoxp-XXXXXXXXXX-XXXXXXXXXX-XXXXXXXXXXX-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"',
         '"token4": "xoxp-572370529330-573807301142-572331691188-####################"'])
rule("slack-app-token", "slack.go", _SL,
     tp=[S("slack", "xapp-1-A052FGTS2DL-5171572773297-610b6a11f4b7eb819e87b767d80e6575a3634791acb9a9ead051da879eb5b55e"),
         '"token1": "xapp-1-A052FGTS2DL-5171572773297-610b6a11f4b7eb819e87b767d80e6575a3634791acb9a9ead051da879eb5b55e"',
         '"token2": "xapp-1-IEMF8IMY1OQ-4037076220459-85c370b433e366de369c4ef5abdf41253519266982439a75af74a3d68d543fb6"',
         '"token3": "xapp-1-BM3V7LC51DA-1441525068281-86641a2582cd0903402ab523e5bcc53b8253098c31591e529b55b41974d2e82f"',
         L('"token4": "xapp-1-A', NUM(10), "-", NUM(13), "-", AN(64), '"')])
rule("slack-config-access-token", "slack.go", _SL,
     tp=[S("access", "xoxe.xoxp-1-Mi0yLTM0MTQwNDE0MDE3Ni0zNjU5NDY0Njg4MTctNTE4MjA3NTQ5NjA4MC01NDEyOTYyODY5NzUxLThhMTBjZmI1ZWIzMGIwNTg0ZDdmMDI5Y2UxNzVlZWVhYzU2ZWQyZTZiODNjNDZiMGUxMzRlNmNjNDEwYmQxMjQ"),
         '"access_token2": "xoxe.xoxp-1-Mi0yLTMxNzcwMjQ0MTcxMy0zNjU5NDY0Njg4MTctNTE1ODE1MjY5MTcxNC01MTU4MDI0MTgyOTc5LWRmY2YwY2U4ODhhNzY5ZGU5MTAyNDU4MDJjMGQ0ZDliMTZhMjNkMmEyYzliNjkzMDRlN2VjZTI4MWNiMzRkNGQ"',
         L('"access_token3": "xoxe.xoxp-1-', AN(163), '"'), L('"access_token5": "xoxe.xoxb-1-', AN(165), '"')],
     fp=["xoxe.xoxp-1-SlackAppConfigurationAccessTokenHere", "xoxe.xoxp-1-RANDOMSTRINGHERE", "xoxe.xoxp-1-initial"])
rule("slack-config-refresh-token", "slack.go", _SL,
     tp=[S("refresh", "xoxe-1-My0xLTMxNzcwMjQ0MTcxMy01MTU4MTUyNjkxNzE0LTUxODE4NDI0MDY3MzYtMjA5MGFkOTFlZThkZWE2OGFlZDYwYWJjODNhYzAxYjA5ZjVmODBhYjgzN2QyNDdjOTNlOGY5NTg2YWM1OGM4Mg"),
         '"refresh_token2": "xoxe-1-My0xLTM0MTQwNDE0MDE3Ni01MTgyMDc1NDk2MDgwLTU0MjQ1NjIwNzgxODEtNGJkYTZhYTUxY2M1ODk3ZTNkN2YzMTgxMDI1ZDQzNzgwNWY4NWQ0ODdhZGIzM2ViOGI0MTM0MjdlNGVmYzQ4Ng"',
         L('"refresh_token3": "xoxe-1-', AN(146), '"')],
     fp=["xoxe-1-xxx", "XOxE-RROAmw, Home and Garden, 5:24, 20120323"])
rule("slack-legacy-bot-token", "slack.go", _SL,
     tp=[S("slack", "xoxb-263594206564-FGqddMF8t08v8N7Oq4i57vs1"),
         '"bot_token2": "xoxb-282029623751-BVtmnS3BQitmjZvjpQL7PSGP"', '"bot_token3": "xoxb-47834520726-N3otsrwj8Cf99cs8GhiRZsX1"',
         '"bot_token4": "xoxb-123456789012-Xw937qtWSXJss1lFaKe"', '"bot_token5": "xoxb-312554961652-uSmliU84rFhnUSBq9YdKh6lS"',
         '"bot_token6": "xoxb-51351043345-Lzwmto5IMVb8UK36MghZYMEi"', '"bot_token7": "xoxb-130154379991-ogFL0OFP3w6AwdJuK7wLojpK"',
         '"bot_token8": "xoxb-159279836768-FOst5DLfEzmQgkz7cte5qiI"', '"bot_token9": "xoxb-50014434-slacktokenx29U9X1bQ"',
         L('"bot_token10": "xoxb-', NUM(10), "-", AN(24)), L('"bot_token11": "xoxb-', NUM(12), "-", AN(23))],
     fp=["xoxb-xxxxxxxxxxx-xxxxxxxxxxxxxxxxxxxxxxxx", "xoxb-Slack_BOT_TOKEN", "xoxb-abcdef-abcdef"])
rule("slack-legacy-workspace-token", "slack.go", _SL,
     tp=[S("slack", "xoxa-2-511111111-31111111111-3111111111111-e039d02840a0b9379c"),
         '"access_token": "xoxa-2-511111111-31111111111-3111111111111-e039d02840a0b9379c"',
         L('"access_token1": "xoxa-', NUM(1), "-", AN(12)), L('"access_token2": "xoxa-', AN(12)),
         L('"refresh_token1": "xoxr-', NUM(1), "-", AN(12)), L('"refresh_token2": "xoxr-', AN(12))],
     fp=["https://github.com/xoxa-nyc/xoxa-nyc.github.io/blob/master/README.md"])
rule("slack-legacy-token", "slack.go", _SL,
     tp=[S("slack", "xoxs-416843729158-132049654-5609968301-e708ba56e1"),
         '"access_token1": "xoxs-3206092076-3204538285-3743137121-836b042620"',
         '"access_token3": "xoxs-420083410720-421837374423-440811613314-977844f625b707d5b0b268206dbc92cbc85feef3e71b08e44815a8e6e7657190"',
         '"access_token4": "xoxs-4829527689-4829527691-4814341714-d0346ec616"',
         '"access_token5": "xoxs-155191149137-155868813314-338998331396-9f6d235915"',
         L('"access_token6": "xoxs-', NUM(10), "-", NUM(10), "-", NUM(10), "-", HEX(10), '"'),
         '"access_token7": "xoxo-523423-234243-234233-e039d02840a0b9379c"'],
     fp=["https://indieweb.org/images/3/35/2018-250-xoxo-indieweb-1.jpg"])
rule("slack-webhook-url", "slack.go", _SL,
     tp=[L("hooks.slack.com/services/", AN(44)), L("http://hooks.slack.com/services/", AN(45)),
         L("https://hooks.slack.com/services/", AN(46)),
         "http://hooks.slack.com/services/T024TTTTT/BBB72BBL/AZAAA9u0pA4ad666eMgbi555",
         "https://hooks.slack.com/services/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",
         L("hooks.slack.com/workflows/", AN(44)), L("http://hooks.slack.com/workflows/", AN(45)),
         L("https://hooks.slack.com/workflows/", AN(46)),
         "https://hooks.slack.com/workflows/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",
         "http://hooks.slack.com/workflows/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",
         L("https://hooks.slack.com/triggers/", AN(56))])
rule("snyk-api-token", "snyk.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("snyk", "12345678-ABCD-ABCD-ABCD-1234567890AB"),
         'const SNYK_TOKEN = "12345678-ABCD-ABCD-ABCD-1234567890AB"', 'const SNYK_KEY = "12345678-ABCD-ABCD-ABCD-1234567890AB"',
         'SNYK_TOKEN := "12345678-ABCD-ABCD-ABCD-1234567890AB"', 'SNYK_TOKEN ::= "12345678-ABCD-ABCD-ABCD-1234567890AB"',
         'SNYK_TOKEN :::= "12345678-ABCD-ABCD-ABCD-1234567890AB"', 'SNYK_TOKEN ?= "12345678-ABCD-ABCD-ABCD-1234567890AB"',
         'SNYK_API_KEY ?= "12345678-ABCD-ABCD-ABCD-1234567890AB"', 'SNYK_API_TOKEN = "12345678-ABCD-ABCD-ABCD-1234567890AB"',
         'SNYK_OAUTH_TOKEN = "12345678-ABCD-ABCD-ABCD-1234567890AB"'])
rule("square-access-token", "square.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("square", X(r"(?:EAAA|sq0atp-)[\w-]{22,60}")), "ARG token=sq0atp-812erere3wewew45678901",
         "ARG token=EAAAlsBxkkVgvmr7FasTFbM6VUGZ31EJ4jZKTJZySgElBDJ_wyafHuBFquFexY7E"],
     fp=["aws-cli@sha256:eaaa7b11777babe28e6133a8b19ff71cea687e0d7f05158dee95a71f76ce3d00"])
rule("square-secret", "square.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa",
     tp=[S("square", X(r"sq0csp-[0-9A-Za-z\-_]{43}")), 'value: "sq0csp-0p9h7g6f4s3s3s3-4a3ardgwa6ADRDJDDKUFYDYDYDY"'])
rule("stripe-access-token", "stripe.go", "07562da07355a496db154176d255b3b4d2bd9637",
     tp=[L('stripeToken := "sk_test_', AN(30), '"')])
rule("sumologic-access-id", "sumologic.go", "163ec211200d21f11033fe7e8530d568577a9ef8",
     tp=['sumologic.accessId = "su9OL59biWiJu7"', 'sumologic_access_id = "sug5XpdpaoxtOH"',
         'export SUMOLOGIC_ACCESSID="suDbJw97o9WVo0"', 'SUMO_ACCESS_ID = "suGyI5imvADdvU"', S1("sumo", "su", AN(12))],
     fp=["- (NSNumber *)sumOfProperty:(NSString *)property;", "- (NSInteger)sumOfValuesInRange:(NSRange)range;",
         "+ (unsigned char)byteChecksumOfData:(id)arg1;", "sumOfExposures = sumOfExposures;",
         ".si-sumologic.si--color::before { color: #000099; }", "/// Based on the SumoLogic keyword syntax:",
         'sumologic_access_id         = ""', "SUMOLOGIC_ACCESSID: ${SUMOLOGIC_ACCESSID}", "export SUMOLOGIC_ACCESSID=XXXXXXXXXXXXXX"])
rule("sumologic-access-token", "sumologic.go", "163ec211200d21f11033fe7e8530d568577a9ef8",
     tp=['export SUMOLOGIC_ACCESSKEY="3HSa1hQfz6BYzlxf7Yb1WKG3Hyovm56LMFChV2y9LgkRipsXCujcLb5ej3oQUJlx"',
         "SUMO_ACCESS_KEY: gxq3rJQkS6qovOg9UY2Q70iH1jFZx0WBrrsiAYv4XHodogAwTKyLzvFK4neRN8Dk",
         "SUMOLOGIC_ACCESSKEY: 9RITWb3I3kAnSyUolcVJq4gwM17JRnQK8ugRaixFfxkdSl8ys17ZtEL3LotESKB7",
         'sumo_access_key = "3Kof2VffNQ0QgYIhXUPJosVlCaQKm2hfpWE6F1fT9YGY74blQBIPsrkCcf1TwKE5"', S1("sumo", AN(64))],
     fp=["#   SUMO_ACCESS_KEY=" + "x" * 64, "-e SUMO_ACCESS_KEY=`etcdctl get /sumologic_secret`",
         "SUMO_ACCESS_KEY={SumoAccessKey}", "SUMO_ACCESS_KEY=${SUMO_ACCESS_KEY:=$2}",
         'sumo_access_key   = "<SUMOLOGIC ACCESS KEY>"', "SUMO_ACCESS_KEY: AbCeFG123"])
_TG = X("[0-9]{8}:A[a-z0-9_-]{34}")
rule("telegram-bot-api-token", "telegram.go", "07e1c305921775a5a2e0e6a597b93d94d26198a7",
     tp=[S1("telegram", _TG), L('const bot = new Telegraf("', _TG, '")'), L("TELEGRAM_API_TOKEN = ", _TG),
         L("telegram bot: ", _TG), S1("telegram", X("[0-9]{5}:A[a-z0-9_-]{34}")), S1("telegram", X("[0-9]{16}:A[a-z0-9_-]{34}"))],
     fp=[S1("telegram", X('<xsd:element name="AgencyIdentificationCode" type="clm[0-9]{5}:AgencyIdentificationCodeContentType')),
         S1("telegram", X('token:"clm[0-9]{5}:AgencyIdentificationCodeContentType"'))])
rule("travisci-access-token", "travisci.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("travis", AN(22))])
rule("twilio-api-key", "twilio.go", "02788fb5ec7f20b962f5e01437f4baacbca3e8fa", tp=[S("twilio", "SK", HEX(32))])
rule("twitch-api-token", "twitch.go", "07562da07355a496db154176d255b3b4d2bd9637", tp=[S1("twitch", AN(30))])
rule("twitter", "twitter.go", "07562da07355a496db154176d255b3b4d2bd9637",
     tp=[L('twitterToken := "', HEX(36), 'aaaa"'), L("twitterToken := `", HEX(36), "aaaa`")])
rule("typeform-api-token", "typeform.go", "18283bb48e7b422fe8198addb3c91f86f820e798",
     tp=[S1("typeformAPIToken", "tfp_", ANE(59))])
rule("yandex-aws-access-token", "yandex.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3",
     tp=[S1("yandex", X(r"YC[a-zA-Z0-9_\-]{38}"))])
rule("yandex-api-key", "yandex.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3", tp=[S1("yandex", X(r"AQVN[A-Za-z0-9_\-]{35,38}"))])
rule("yandex-access-token", "yandex.go", "1592c1c7987a8d86f4d036e5a8e007c31f409cc3",
     tp=[S1("yandex", X(r"t1\.[A-Z0-9a-z_-]+[=]{0,2}\.[A-Z0-9a-z_-]{86}[=]{0,2}"))])
rule("zendesk-secret-key", "zendesk.go", "28630a226ad6c2e90b0886086351aedbd89ff7ec", tp=[S1("zendesk", AN(40))])
rule("microsoft-teams-webhook", "teams.go", "03e4a9e42b9e7dd8ea0c637ea4fe9ae9d01f7357",
     tp=[L("https://mycompany.webhook.office.com/webhookb2/",
           X(r"[a-z0-9]{8}-([a-z0-9]{4}-){3}[a-z0-9]{12}@[a-z0-9]{8}-([a-z0-9]{4}-){3}[a-z0-9]{12}/IncomingWebhook/[a-z0-9]{32}/[a-z0-9]{8}-([a-z0-9]{4}-){3}[a-z0-9]{12}"))])
rule("claude-code-oauth-token", "claude_code.go", "12e873472de7a3ea1850211c9ebecd18abf4d658",
     tp=["sk-ant-oat01-abc123xyz_456def789ghij-klmnopqrstuvwx-3456yza789bcde-1234fghijklmnopby56aaaogaopaaaabc123xyzZQ",
         S1("claude-code", "sk-ant-oat01-", ANES(95)), L('CLAUDE_CODE_OAUTH_TOKEN="sk-ant-oat01-', ANES(95), '"')])
rule("datafactory-shir-token", "datafactory.go", "00ffb945cdc51c4aca5d996c4f4954b04c0251a5",
     tp=["IR@40040abc-b2f2-8tyg-ab39-90a490zzzaae@adf-myapp-001@we@uUY/w9WdKTdAWWPDMrEEWdAEZIgeXlrO51GtVUR1/BE="])
for _p in ("pat", "aat", "sat"):
    rule(f"settlemint-{_p}", "settlemint.go", "09056616ac4ce08d5ea9b46c777d1e99c46f3986",
         tp=[S("settlemintToken", f"sm_{_p}_", AN(16))])
rule("sourcegraph-access-token", "sourcegraph.go", "0bf04d088734940f515131910adda4d46ea64464",
     tp=["sgp_AaD80dc6E02eCAE1_d3cba16CC0F18fA14A2EFB61CbDFceEBf9fAD16b",
         'environment("TOKEN", "sgp_1a2b3c4d5e6f7890_AbC123DeF456789012345678901234567890AbCd")',
         "sgp_0D697F54cb24238EefB29af05Abf1b505E90950F", "sgp_local_d7dfFD43cF2503B1da673EB560aAa3e80f16FA42",
         "sgp_local_bcD1DA18de0d6476Be0f3BD7Ef9Da4f09b479aE5",
         '{"token": "sgp_1A2B3C4D5E6F7890_abcdef1234567890abcdef1234567890abcdef12"}'],
     fp=["sgp_5555555dAAAAA7777777CcccCFaaaaaaaaaaaaaa", "sgp_0000000000000000_0000000000000000000000000000000000000000",
         "sgp_xxxxxxxxxxxxxxxx_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"])
rule("squarespace-access-token", "squarespace.go", "2ce7c735f4083df6fcb67e301055d8b445f949e9",
     tp=[S1("squarespace", HEX_UUID())])
rule("sonar-api-token", "sonar.go", "81796067d55ac94f161f67b6582e750573cd2d01",
     tp=[S("sonar", "12345678ABCDEFH1234567890ABCDEFH12345678"),
         'const SONAR_LOGIN = "12345678ABCDEFH1234567890ABCDEFH12345678"', 'SONAR_LOGIN := "12345678ABCDEFH1234567890ABCDEFH12345678"',
         'SONAR.LOGIN ::= "12345678ABCDEFH1234567890ABCDEFH12345678"', 'SONAR.LOGIN :::= "12345678ABCDEFH1234567890ABCDEFH12345678"',
         'SONAR.LOGIN ?= "12345678ABCDEFH1234567890ABCDEFH12345678"', 'const SONAR_TOKEN = "squ_12345678ABCDEFH1234567890ABCDEFH12345678"',
         'SONAR_LOGIN := "sqp_12345678ABCDEFH1234567890ABCDEFH12345678"', 'SONAR.TOKEN = "sqa_12345678ABCDEFH1234567890ABCDEFH12345678"'])
rule("notion-api-token", "notion.go", "09eba9f67a17a5d01f0eb8c431e3a1eda676ffc5",
     tp=["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", "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",
         "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"],
     fp=["ntn_12345678901", "ntn_123456789012345678901234567890123456789012345678901234567890", "ntn_12345678901abc"])
rule("openrouter-api-key", "openrouter.go", "794784c0fb3eebca0996d9e2c046c77b8821d9c1",
     tp=["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",
         "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",
         "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",
         S1("openrouter", "sk-or-v1-", HEX(64))])
rule("meraki-api-key", "meraki.go", "03467c5a3814a4cb10100edad819508ee1ed83ce", tp=[S("meraki", HEX(40))],
     fp=["│e9e0f062f587b_423bb6cc6328eb786d75b45783e.bfu"])
rule("RSA-PK", "RSA.go", "32fb6035f9951d85e5f28cad2c854148cc01b42b", tp=["-----BEGIN RSA PRIVATE KEY-----"])
rule("xai-api-key", "xai.go", "90039844123c1cd7831d55edf468633415730f17", tp=[S("xai", "xai-", AN(80))],
     fp=["XAI_API_KEY=xai-" + "x" * 80])
rule("supabase-service-key", "supabase.go", "90039844123c1cd7831d55edf468633415730f17",
     tp=[S("supabase", "sbp_", HEX(40))], fp=["SUPABASE_PAT=sbp_" + "x" * 40])
rule("replicate-api-token", "replicate.go", "bef9dd518790dd479ed5fca5f99ef08713e5fc44", tp=[S("replicate", "r8_", AN(40))])

# -- detect-secrets ---------------------------------------------------------------------------

_M = "m{{h}o)p${e]nob(ody[finds>-_$#thisone}}"
_KW = "0e8925d685f1fe34a1e315045450cd678104648c"
rule("keyword", "tests/plugins/keyword_test.py", _KW, base=DETECT_SECRETS,
     tp=[s.replace("M", _M) for s in [
         # FOLLOWED_BY_COLON_EQUAL_SIGNS_RE positives
         'apikey := "M"', 'apikey :="M"', 'apikey  :=   "M"', "apikey := 'M'", "apikey :='M'", 'apikey:= "M"',
         'apikey:="M"', "apikey:= 'M'", "apikey:='M'", "apikey:=  'M'",
         "apikey := M", "apikey :=M", "apikey:= M", "apikey:=M",
         # FOLLOWED_BY_COLON_RE positives
         "'theapikey': 'M'", '"theapikey": "M"', 'apikey: "M"', "apikey:  'M'", "apikey: M", "apikey:M", "theapikey:M",
         # FOLLOWED_BY_EQUAL_SIGNS_OPTIONAL_BRACKETS_OPTIONAL_AT_SIGN_QUOTES_REQUIRED_REGEX positives
         'apikey = "M"', 'apikey ="M"', 'apikey  =   "M"', 'apikey = @"M"', 'apikey =@"M"', 'apikey  =   @"M"',
         'apikey[]= "M"', 'apikey[]="M"',
         # FOLLOWED_BY_EQUAL_SIGNS_RE positives
         'some_dict["secret"] = "M"', 'the_password= "M"\n', "the_password='M'\n",
         "some_dict['secret'] = M", "my_password=M", "my_password= M", "my_password =M", "my_password = M",
         "the_password=M\n",
         # FOLLOWED_BY_QUOTES_AND_SEMICOLON_RE positives
         'apikey "M";', 'fooapikeyfoo "M";', 'fooapikeyfoo"M";', "private_key 'M';", "fooprivate_keyfoo'M';",
         "fooprivate_key'M';"]],
     fp=['theapikey := ""', 'theapikey := "somefakekey"', "theapikeyforfoo := hopenobodyfindsthisone",
         'theapikey: ""', 'theapikey: "somefakekey"', "theapikeyforfoo:hopenobodyfindsthisone", "password: ${link}",
         'some_key = "real_secret"', 'my_password = ""', "my_password = ''", 'my_password = "fakesecret"',
         'open(self, password = ""):', "my_password = foo(hey)you", "my_password = request.json_body['hey']",
         "my_password = True", "login(username=username, password=password)",
         'private_key "";', "private_key '\"no spaces';", 'private_key "fake";', 'private_key "some/dir/aint/a/secret";',
         'private_key "${FOO}";', 'theapikey[] = ""', 'theapikey = @"somefakekey"',
         "apiKey: this.apiKey,", "apiKey: fs.readFileSync('foo',", "$password = $input;"])
rule("basic-auth", "tests/plugins/basic_auth_test.py", "138816fb36190fe36da0ffdb01cdad227f25bb35", base=DETECT_SECRETS,
     tp=["https://username:password@yelp.com"], fp=["http://localhost:5000/<%= @variable %>"])
# The hex and base64 high-entropy plugins: their examples in the three quoting forms the test uses.
_HE = "00e60762d7367b30db3ead6c98392e66bdf62d24"
rule("high-entropy-strings", "tests/plugins/high_entropy_strings_test.py", _HE, base=DETECT_SECRETS,
     tp=[f.format(s) for s in ("2b00042f7481c7b056c4b410d28f33cf",
                                 "c3VwZXIgbG9uZyBzdHJpbmcgc2hvdWxkIGNhdXNlIGVub3VnaCBlbnRyb3B5",
                                 "I6FwzQZFL9l-44nviI1F04OTmorMaVQf9GS4Oe07qxL_vNkW6CRas4Lo42vqJMT0M6riJfma_f-pTAuoX2U=")
         for f in ('"{}"', "'{}'", "{}")],
     fp=[f.format(s) for s in ("aaaaaa", "c3VwZXIgc2VjcmV0IHZhbHVl", "Zrm-ySTAq7D2sHk=") for f in ("'{}'", '"{}"')])
rule("private-key", "tests/plugins/private_key_test.py", "01396dcf7a77d6bb7c39bd22458a8e2d230f7c04", base=DETECT_SECRETS,
     tp=['"-----BEGIN RSA PRIVATE KEY-----\\nc3VwZXIgZHVwZXIgc2VjcmV0IHBhc3N3b3JkLCBzdXBlciBkdXBlciBzZ\\nWNyZXQgcGFzc3dvcmQhMTIzNCMkJQpzdXBlciBkdXBlciBzZWNyZXQgcGFzc3dvcmQsIHN1cGVyIGR1cGVyIHNlY3JldCBwYXNzd29yZCExMjM0IyQlCgo=\\n-----END RSA PRIVATE KEY-----"',
         "some text here\n-----BEGIN PRIVATE KEY-----\nc3VwZXIgZHVwZXIgc2VjcmV0IHBhc3N3b3JkLCBzdXBlciBkdXBlciBzZWNyZXQgcGFzc3dvcmQhMTIzNCMkJQpzdXBlciBkdXBlciBzZWNyZXQgcGFzc3dvcmQsIHN1cGVyIGR1cGVyIHNlY3JldCBwYXNzd29yZCExMjM0IyQlCgo=\n-----END PRIVATE KEY-----",
         "some text here\nPuTTY-User-Key-File-2\nsecret key"])
rule("password", "tests/plugins/password_test.py", "57abcc1349fd863bf26bb55be0d66496832b9c9f", base=DETECT_SECRETS,
     tp=["login_somewhere --http-password hopenobodyfindsthisone\n", 'token = "noentropy"'])
rule("aws-key", "tests/plugins/aws_key_test.py", "13575ede7f9d6f7cb17ac317a19ec5060c97170b", base=DETECT_SECRETS,
     tp=["AKIAZZZZZZZZZZZZZZZZ", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
         'secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"'],
     fp=["akiazzzzzzzzzzzzzzzz", "AKIAZZZ"])
_JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
rule("jwt", "tests/plugins/jwt_test.py", "26489629da1be60d13358cd3cf958ee4e97add5f", base=DETECT_SECRETS,
     tp=[_JWT + ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
         "eyJ0eXAiOiJKV1QiLA0KImFsZyI6IkhTMjU2In0.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ",
         "eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiJ9.eyJuYW1lIjoiSm9lIiwKInN0YXR1cyI6ImVtcGxveWVlIgp9",
         "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IsWww6HFkcOtIMOWxZHDqcOoIiwiaWF0IjoxNTE2MjM5MDIyfQ.k5HibI_uLn_RTuPcaCNkaVaQH2y5q6GvJg8GPpGMRwQ",
         _JWT],
     fp=['{"alg":"HS256","typ":"JWT"}.{"name":"Jon Doe"}.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c',
         "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9", "jwt", "eyJAAAA.eyJBBB", "eyJBB.eyJCC.eyJDDDD"])
rule("slack", "tests/plugins/slack_test.py", "13575ede7f9d6f7cb17ac317a19ec5060c97170b", base=DETECT_SECRETS,
     tp=["xoxp-523423-234243-234233-e039d02840a0b9379c", "xoxo-523423-234243-234233-e039d02840a0b9379c",
         "xoxs-523423-234243-234233-e039d02840a0b9379c", "xoxa-511111111-31111111111-3111111111111-e039d02840a0b9379c",
         "xoxa-2-511111111-31111111111-3111111111111-e039d02840a0b9379c", "xoxr-523423-234243-234233-e039d02840a0b9379c",
         "xoxb-34532454-e039d02840a0b9379c"])
rule("stripe", "tests/plugins/stripe_key_test.py", "30ecb2da0b08dca52a32b4028f7b21f92b8e1ff7", base=DETECT_SECRETS,
     tp=["sk_live_ReTllpYQYfIZu2Jnf2lAPFjD", "rk_live_5TcWfjKmJgpql9hjpRnwRXbT"], fp=["sk_live_"])
rule("discord", "tests/plugins/discord_test.py", "0ac69f67eaddf816aab0f6a79a7317e4a499ee80", base=DETECT_SECRETS,
     tp=["MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs", "Nzk5MjgxNDk0NDc2NDU1OTg3.YABS5g.2lmzECVlZv3vv6miVnUaKPQi2wI",
         "MZ1yGvKTjE0rY0cV8i47CjAa.uRHQPq.Xb1Mk2nEhe-4iUcrGOuegj57zMC"])
rule("gitlab-token", "tests/plugins/gitlab_token_test.py", "31dc69f2cd145ea506a39ccf98b3db3578ad81cd", base=DETECT_SECRETS,
     tp=["glpat-hellOworld380_testin", "gldt-HwllOuhfw-wu0rlD_yep", "glsoat-PREfix_helloworld380_testin_pretty_long_token_long"],
     fp=["glpat-hellOWorld380 testin", "foo_hello-world80_testin"])
rule("openai", "tests/plugins/openai_test.py", "76c629771f7f23a4aa36cdd519a2257bad424905", base=DETECT_SECRETS,
     tp=["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", "sk-proj-Xi8tdMjHV6pmbBbwilTeT3BlbkFJ3UDnpdEwNNm6wVBpYM0o"])
rule("telegram-token", "tests/plugins/telegram_token_test.py", "1f2553382bf10184779ec5b38bf5dfaefed8e426", base=DETECT_SECRETS,
     tp=["bot110201543:AAHdqTcvCH1vGWJxfSe1ofSAs0K5PALDsaw", "110201543:AAHdqTcvCH1vGWJxfSe1ofSAs0K5PALDsaw",
         "7213808860:AAH1bjqpKKW3maRSPAxzIU-0v6xNuq2-NjM"], fp=["foo"])
_AZ = "lJzRc1YdHaAA2KCNJJ1tkYwF/+mKK6Ygw0NGe170Xu592euJv2wYUtBlV8z+qnlcNQSnIYVTkLWntUO1F8j8rQ=="
# Only the labelled and Azure-context cases; a bare key (the rule wants "azure" nearby) is a key all the same.
rule("azure-storage-key", "tests/plugins/azure_storage_key_test.py", "052fb20e256b40b569f3e23c6cb432cdfdbc81f1",
     base=DETECT_SECRETS,
     tp=[f"AccountKey={_AZ}", f'AccountKey="{_AZ}"', f"AccountKey='{_AZ}'",
         f"(https://portal.azure.com/). +CREATE DATABASE SCOPED CREDENTIAL AzureStorageCredential +WITH IDENTITY = 'IDENTITY', {_AZ}",
         f"(https://portal.azure.com/). +CREATE DATABASE SCOPED CREDENTIAL AzureStorageCredential +WITH IDENTITY = 'IDENTITY',\n                {_AZ}",
         f"azure.com +WITH IDENTITY = 'IDENTITY',\n                {_AZ}"],
     fp=["learS3Bucket", "anupRole", "cret", f"PublicKey: {_AZ}", f"PublicKey: ssh-rsa {_AZ}", f"SshPublicKey: ssh-rsa {_AZ}",
         "\n                resolution: {integrity: sha512-/AazAV/F+HK4LIywF9C+NYHcJo038zEnWkteilcxC1FM/uK/4NVGDKGrxx7nNq1ybspAroRKT4I1FHfxQzxkUw==}\n                engines: {node: '>=12.0.0'}\n"])
rule("grafana", "tests/plugins/grafana_test.py", "1c99c926f23f5d0915bb27b3f2ab8d312347812e", base=DETECT_SECRETS,
     tp=["eyJrIjoiR0ZXZmt1UFc0OEpIOGN5RWdUalBJTllUTk83VlhtVGwiLCJuIjoiYXBpa2V5Y3VybCIsImlkIjo2fQ==",
         "glsa_Q0tTx59W5f7LXgxiM4MjJs75176oun5F_e5c6b96d",
         "eyJrIjoiZjJlZThiNDMwZGQ0ZDhjNjJhYmQwZWY3NDgxYzhjNjRiNzZkNjYyMiIsIm4iOiJ0ZXN0LWtleSIsImlkIjo5OTk5OX0=",
         "glc_eyJrIjoiZjI0YzZkNGEwZDBmZmZjMmUzNTU2ODcxMmY0ZWZlNTQ1NTljMDFjOCIsIm4iOiJteXRva2VuIiwiaWQiOjF9"])
rule("okta", "tests/plugins/okta_test.py", "57bac639e9665eca9a3ce0e75f8f910a735781c1", base=DETECT_SECRETS,
     tp=["00ZDreYRgPTWY4MpAf5ED9TVXjfS9XKxT6Fy3fC7uA"])
rule("pypi-token", "tests/plugins/pypi_token_test.py", "8eebb5c152ec559d73b737212d72f43e88e3f623", base=DETECT_SECRETS,
     tp=["pypi-AgEIcHlwaS5vcmcCJDU3OTM1MjliLWIyYTYtNDEwOC05NzRkLTM0MjNiNmEwNWIzYgACF1sxLFsitesttestbWluaW1hbC1wcm9qZWN0Il1dAAIsWzIsWyJjYWY4OTAwZi0xNDMwLTRiYQstYmFmMi1mMDE3OGIyNWZhNTkiXV0AAAYgh2UINPjWBDwT0r3tQ1o5oZyswcjN0-IluP6z34SX3KM",
         "pypi-AgENdGVzdC5weXBpLm9yZwIkN2YxOWZhOWEtY2FjYS00MGZhLTj2MGEtODFjMnE2MjdmMzY0AAIqWzMsImJlM2FiOWI5LTRmYUTnNEg4ZS04Mjk0LWFlY2Y2NWYzNGYzNyJdAAAGIMb5Hb8nVvhcAizcVVzA-bKKnwN7Pe0RmgPRCvrPwyJf"])
rule("hashicorp-vault-token", "tests/plugins/hashicorp_vault_token_test.py", "d30339a3d512869067fa495375e07b0769030067",
     base=DETECT_SECRETS,
     tp=["hvs.wWPw5k4aXcaT4fNP0UcnZwJUVFk6LO0pINUx", "HideMyTokenhvs.wWPw5k4aXcaT4fNP0UcnZwJUVFk6LO0pINUx",
         "s.wWPw5k4aXcaT4fNP0UcnZwJUVFk6LO0pINUx"],
     fp=["hvs.wWPw5k4aXcaT", "MyClass.atLeast24CharactersField", "foo"])
rule("npm", "tests/plugins/npm_test.py", "38995ef8c91300a2316dede8782809caf2643f03", base=DETECT_SECRETS,
     tp=["//registry.npmjs.org/:_authToken=743b294a-cd03-11ec-9d64-0242ac120002",
         "//registry.npmjs.org/:_authToken=346a14f2-a672-4668-a892-956a462ab56e",
         "//registry.npmjs.org/:_authToken= 743b294a-cd03-11ec-9d64-0242ac120002",
         "//registry.npmjs.org/:_authToken=npm_xxxxxxxxxxx", "//registry.npmjs.org/:_auth=dGVzdDp0ZXN0",
         "//private.registry.com/:_auth=YWRtaW46cGFzc3dvcmQ=", "//registry.example.com/:_auth=foobar",
         "//registry.npmjs.org/:_auth= dGVzdDp0ZXN0", "//registry.npmjs.org/:_auth=SGVsbG8gV29ybGQ+",
         "//registry2.example.com/:_authToken=MYTOKEN2", "//private.npm.registry/:_authToken=CUSTOM_TOKEN_123",
         "//registry.npmjs.org/:_authToken=abc123def456", "//registry.npmjs.org/:_authToken=token_with_underscores",
         "//registry.npmjs.org/:_authToken=token-with-hyphens", "//registry.npmjs.org/:_authToken= MYTOKEN2"],
     fp=["foo", "//registry.npmjs.org/:_authToken=${NPM_TOKEN}", "//registry.npmjs.org/:_auth=${AUTH_TOKEN}",
         "//registry.npmjs.org/:_authToken=", "//registry.npmjs.org/:_auth="])
