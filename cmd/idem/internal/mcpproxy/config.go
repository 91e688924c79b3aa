package mcpproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/idemkit/idem"
)

// Config says which tools the proxy protects. It is read from a YAML or JSON
// file (JSON is YAML) by LoadConfig:
//
//	tools:
//	  create_order: {}                 # protected: the key comes from _meta
//	  cancel_order: {keyArgs: [order_id]}  # protected: a natural key from arguments
//	  get_order: {readOnly: true}      # relayed as is, no warning
//	missingKey: refuse                 # or run
//
// A tools/call of a tool not listed here is relayed unprotected; unless the
// server's tools/list marked the tool read-only (annotations.readOnlyHint),
// the proxy warns on stderr the first time each such tool is called.
type Config struct {
	// Tools maps a tool's name to how its calls are protected.
	Tools map[string]Tool `yaml:"tools"`
	// MissingKey is what a call of a protected tool with no idempotency key
	// gets: "refuse" (the empty default) answers a JSON-RPC error with code
	// CodeKeyRequired and runs nothing; "run" relays it unprotected with a
	// warning on stderr.
	MissingKey string `yaml:"missingKey"`
	// MetaKey is the name, in a tools/call's params._meta, of the
	// idempotency key of a protected tool without KeyArgs: for clients of
	// another convention than idemmcp's. Empty means MetaKey
	// ("io.github.idemkit/idempotency-key"). The request sent to the server
	// carries the key under MetaKey whatever this name (the client's own
	// _meta entries pass unchanged).
	MetaKey string `yaml:"metaKey"`
}

// KeyName returns the _meta name of the idempotency key: c.MetaKey, or the
// package's MetaKey when that is empty.
func (c *Config) KeyName() string {
	if c.MetaKey != "" {
		return c.MetaKey
	}
	return MetaKey
}

// ErrBadTool is wrapped by Protect's errors: a tool that cannot be
// protected as asked.
var ErrBadTool = errors.New("cannot protect the tool")

// Protect adds tool name, protected with the key from _meta (Tool{}), as
// `idem mcp-proxy --tool NAME` does beside a configuration file. A tool the
// configuration already protects keeps its entry (its KeyArgs too). An
// empty name, or a tool the configuration marks ReadOnly, is an error
// wrapping ErrBadTool, and c is unchanged.
func (c *Config) Protect(name string) error {
	if name == "" {
		return fmt.Errorf("%w %q: its name is empty", ErrBadTool, name)
	}
	t, ok := c.Tools[name]
	switch {
	case ok && t.ReadOnly:
		return fmt.Errorf("%w %q: the configuration marks it readOnly", ErrBadTool, name)
	case ok:
		return nil
	}
	if c.Tools == nil {
		c.Tools = map[string]Tool{}
	}
	c.Tools[name] = Tool{}
	return nil
}

// Tool is the configuration of one tool.
type Tool struct {
	// ReadOnly marks a tool whose calls have no side effect: relayed as is,
	// never recorded, never warned about.
	ReadOnly bool `yaml:"readOnly"`
	// KeyArgs, if not empty, makes the key natural: idem.KeyOf of the tool's
	// name and the canonical JSON (Canonical) of each named argument, in this
	// order (an absent argument counts as null). A key in _meta is then
	// ignored. Without KeyArgs the key is _meta's MetaKey.
	KeyArgs []string `yaml:"keyArgs"`
}

// The values of Config.MissingKey.
const (
	MissingKeyRefuse = "refuse"
	MissingKeyRun    = "run"
)

// LoadConfig reads the configuration file at path (YAML or JSON). Unknown
// fields, a bad MissingKey, a tool both ReadOnly and with KeyArgs, and an
// empty tool name are errors.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mcp-proxy config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("mcp-proxy config %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses a configuration (YAML or JSON) and validates it as
// LoadConfig does (a tool with KeyArgs needs a name of at most
// idem.MaxNamespaceLen bytes, KeyOf's namespace). Empty input is the empty configuration: nothing protected.
func ParseConfig(data []byte) (*Config, error) {
	c := &Config{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) validate() error {
	switch c.MissingKey {
	case "", MissingKeyRefuse, MissingKeyRun:
	default:
		return fmt.Errorf("missingKey must be %q or %q, not %q", MissingKeyRefuse, MissingKeyRun, c.MissingKey)
	}
	for name, t := range c.Tools {
		if name == "" {
			return errors.New("a tool with an empty name")
		}
		if t.ReadOnly && len(t.KeyArgs) > 0 {
			return fmt.Errorf("tool %q: readOnly and keyArgs exclude each other", name)
		}
		if len(t.KeyArgs) > 0 && (len(name) > idem.MaxNamespaceLen || !utf8.ValidString(name)) {
			// The name is idem.KeyOf's namespace.
			return fmt.Errorf("tool %q: keyArgs needs a name of at most %d bytes of UTF-8", name, idem.MaxNamespaceLen)
		}
	}
	return nil
}
