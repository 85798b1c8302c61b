// verify.js checks one delivery's Standard Webhooks signature with the npm
// standardwebhooks package, an implementation independent of backstop's.
//
// It reads one JSON object on stdin:
//   {"secret": "whsec_…", "headers": {"webhook-id": …, …}, "body_base64": "…"}
// and exits 0 when new Webhook(secret).verify(body, headers) succeeds, 1 when
// it throws (the reason on stderr), 2 on bad input.
"use strict";

const { Webhook } = require("standardwebhooks");

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
  input += chunk;
});
process.stdin.on("end", () => {
  let req;
  try {
    req = JSON.parse(input);
  } catch (err) {
    console.error(`verify.js: stdin is not JSON: ${err.message}`);
    process.exit(2);
  }
  const body = Buffer.from(req.body_base64 || "", "base64").toString("utf8");
  try {
    new Webhook(req.secret).verify(body, req.headers || {});
  } catch (err) {
    console.error(`verify.js: ${err.name}: ${err.message}`);
    process.exit(1);
  }
  console.log("verified");
});
