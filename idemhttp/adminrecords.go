package idemhttp

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/idemkit/idem/idemcore"
)

// The admin handler's routes over records: get, forget, resolve.

// adminQueryKey returns the key parameter: present and unique.
func adminQueryKey(r *http.Request) (string, error) {
	keys, ok := r.URL.Query()["key"]
	if !ok || len(keys) != 1 {
		return "", adminBadRequest("give one key parameter: ?key=KEY (query-escaped)")
	}
	return keys[0], nil
}

func (a *admin) getRecord(w http.ResponseWriter, r *http.Request) error {
	key, err := adminQueryKey(r)
	if err != nil {
		return err
	}
	rec, err := a.op.Get(key)
	if err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, a.record(rec))
}

func (a *admin) forget(w http.ResponseWriter, r *http.Request) error {
	key, err := adminQueryKey(r)
	if err != nil {
		return err
	}
	if err := a.op.Forget(key); err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, adminForgotten{Key: key, Forgotten: true})
}

// adminResolveBody is the JSON body of POST /records/resolve.
type adminResolveBody struct {
	Response         *string          `json:"response"`
	ResponseEncoding string           `json:"response_encoding"`
	Error            *AdminErrorJSON  `json:"error"`
	HTTP             *adminHTTPAnswer `json:"http"`
}

// adminHTTPAnswer is a resolve's "http" member: an HTTP answer, stored in
// Middleware's format (EncodeResponse).
type adminHTTPAnswer struct {
	Status       int         `json:"status"`
	Headers      http.Header `json:"headers"`
	Body         string      `json:"body"`
	BodyEncoding string      `json:"body_encoding"`
}

// decodeText decodes s as encoding names it: "utf-8" (or "") or "base64".
func decodeText(s, encoding, member string) ([]byte, error) {
	switch encoding {
	case "", "utf-8":
		return []byte(s), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, adminBadRequest(member + " is not valid base64: " + err.Error())
		}
		return b, nil
	default:
		return nil, adminBadRequest(fmt.Sprintf("%s_encoding must be utf-8 or base64, not %q", member, encoding))
	}
}

func (a *admin) resolve(w http.ResponseWriter, r *http.Request) error {
	key, err := adminQueryKey(r)
	if err != nil {
		return err
	}
	var body adminResolveBody
	if err := a.readJSON(w, r, &body); err != nil {
		return err
	}
	var resp []byte
	if body.HTTP != nil {
		if body.Response != nil || body.Error != nil || body.ResponseEncoding != "" {
			return adminBadRequest(`"http" excludes "response", "response_encoding" and "error"`)
		}
		b, err := decodeText(body.HTTP.Body, body.HTTP.BodyEncoding, "body")
		if err != nil {
			return err
		}
		if resp, err = EncodeResponse(body.HTTP.Status, body.HTTP.Headers, b); err != nil {
			return adminBadRequest(err.Error())
		}
	}
	if body.Response != nil {
		if resp, err = decodeText(*body.Response, body.ResponseEncoding, "response"); err != nil {
			return err
		}
		if resp == nil {
			resp = []byte{} // "" is an empty response, not none
		}
	}
	var outcome *idemcore.Error
	if body.Error != nil {
		outcome = &idemcore.Error{Code: body.Error.Code, Message: body.Error.Message}
	}
	if err := a.op.Resolve(key, resp, outcome); err != nil {
		return err
	}
	rec, err := a.op.Get(key)
	if err != nil {
		return err
	}
	return adminWriteJSON(w, http.StatusOK, a.record(rec))
}

// readJSON decodes r's body into v: application/json, at most MaxBody
// bytes, one object with no unknown members.
func (a *admin) readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return &adminError{status: http.StatusUnsupportedMediaType, code: "unsupported_media_type",
			detail: "the body must be JSON, with Content-Type: application/json"}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, a.opts.MaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			return &adminError{status: http.StatusRequestEntityTooLarge, code: "too_large",
				detail: fmt.Sprintf("the body exceeds %d bytes", a.opts.MaxBody)}
		}
		return adminBadRequest("the body is not the JSON object expected: " + err.Error())
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return adminBadRequest("the body holds more than one JSON value")
	}
	return nil
}

// record renders rec, with its response only under ShowResponses.
func (a *admin) record(rec *idemcore.Record) AdminRecord {
	return NewAdminRecord(rec, idemcore.Expiry(rec, a.op.Retention()), a.opts.ShowResponses)
}

// adminForgotten is the answer of DELETE /records.
type adminForgotten struct {
	Key       string `json:"key"`
	Forgotten bool   `json:"forgotten"`
}
