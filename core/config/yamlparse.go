package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Config text is bounded before and while it is parsed, because the YAML
// library's own duplicate-key report is quadratic in the keys of a mapping
// and returned whole: an 8 KB file of 4000 "?" lines took it 20 seconds
// and produced a 450 MB message. A config has a few dozen keys, so text is
// parsed into a node tree (linear), checked here with the limits below, and
// only then decoded.
const (
	// MaxTextBytes is the largest config file or text accepted.
	MaxTextBytes = 1 << 20
	// maxMappingKeys bounds the keys of one YAML mapping.
	maxMappingKeys = 1024
	// maxNodes bounds the nodes of a document, aliases counted as the
	// nodes they expand to.
	maxNodes = 100000
	// maxErrLines and maxErrLineBytes cut a parse error to its first lines.
	maxErrLines     = 4
	maxErrLineBytes = 300
	// maxShownValue bounds a value quoted in an error message, and
	// maxLayerErrBytes the problems one layer reports together.
	maxShownValue    = 80
	maxLayerErrBytes = 1200
)

// boundedYAML is a koanf parser for config YAML with the limits above.
type boundedYAML struct{}

// Unmarshal parses b into the nested map koanf expects.
func (boundedYAML) Unmarshal(b []byte) (map[string]any, error) {
	if len(b) > MaxTextBytes {
		return nil, fmt.Errorf("config text is %d bytes, over the limit of %d (1 MiB); a config needs a few KiB", len(b), MaxTextBytes)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, cutError(err)
	}
	if err := checkNodes(&doc); err != nil {
		return nil, err
	}
	if len(doc.Content) > 0 {
		if top := doc.Content[0]; top.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("yaml: line %d: the top level is %s; a config is a mapping of sections to their keys, one per line, such as \"train:\" followed by \"  steps: 300\"", top.Line, nodeKind(top))
		}
	}
	out := map[string]any{}
	if err := doc.Decode(&out); err != nil {
		return nil, cutError(err)
	}
	return out, nil
}

// Marshal is koanf's reverse direction, unused by the loader.
func (boundedYAML) Marshal(m map[string]any) ([]byte, error) { return yaml.Marshal(m) }

// plainTags are the types a config value may be given explicitly. Any
// other tag (!!python/object, !custom, !!binary) is refused: nothing in a
// config needs one, and an object tag is how YAML is made to build things
// other than data.
var plainTags = map[string]bool{"!!str": true, "!!int": true, "!!float": true, "!!bool": true, "!!null": true, "!!map": true, "!!seq": true, "!!merge": true}

// nodeKind names what a YAML node is, for messages.
func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("a single value (%s)", quoteCut(n.Value))
	case yaml.AliasNode:
		return "an alias"
	}
	return "not a mapping"
}

// quoteCut quotes s, escaped, cut to maxShownValue bytes.
func quoteCut(s string) string {
	if len(s) > maxShownValue {
		return strconv.Quote(s[:maxShownValue]) + "..."
	}
	return strconv.Quote(s)
}

// checkNodes walks the tree once, refusing a duplicate key (reported with
// both lines, found with a map instead of the library's pairwise scan), a
// mapping with too many keys, and a document that expands (through
// aliases) to too many nodes.
func checkNodes(root *yaml.Node) error {
	sizes := map[*yaml.Node]int{} // expanded size of each node, once
	var size func(n *yaml.Node, depth int) (int, error)
	size = func(n *yaml.Node, depth int) (int, error) {
		if s, ok := sizes[n]; ok {
			return s, nil
		}
		if depth > 100 {
			return 0, fmt.Errorf("yaml: line %d: nested more than 100 levels deep", n.Line)
		}
		if n.Style&yaml.TaggedStyle != 0 && !plainTags[n.Tag] {
			return 0, fmt.Errorf("yaml: line %d: tag %s is not accepted; a config holds only strings, numbers, booleans, lists and mappings", n.Line, quoteCut(n.Tag))
		}
		if n.Kind == yaml.MappingNode {
			seen := map[string]int{}
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if k.Kind != yaml.ScalarNode {
					continue // the decoder rejects non-string keys itself
				}
				id := k.Tag + "\x00" + k.Value
				if first, dup := seen[id]; dup {
					return 0, fmt.Errorf("yaml: line %d: mapping key %q already defined at line %d", k.Line, k.Value, first)
				}
				seen[id] = k.Line
			}
			if len(n.Content)/2 > maxMappingKeys {
				return 0, fmt.Errorf("yaml: line %d: a mapping of %d keys, over the limit of %d", n.Line, len(n.Content)/2, maxMappingKeys)
			}
		}
		total := 1
		kids := n.Content
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			kids = []*yaml.Node{n.Alias}
		}
		for _, c := range kids {
			s, err := size(c, depth+1)
			if err != nil {
				return 0, err
			}
			if total += s; total > maxNodes {
				return 0, fmt.Errorf("yaml: the document expands to more than %d nodes (aliases included); a config has a few dozen", maxNodes)
			}
		}
		sizes[n] = total
		return total, nil
	}
	_, err := size(root, 0)
	return err
}

// cutError keeps the first lines of a parse error, each cut short, so that
// a message about a broken file stays readable whatever the file holds.
func cutError(err error) error {
	lines := strings.Split(err.Error(), "\n")
	more := len(lines) - maxErrLines
	if more > 0 {
		lines = lines[:maxErrLines]
	}
	for i, l := range lines {
		if len(l) > maxErrLineBytes {
			lines[i] = l[:maxErrLineBytes] + "..."
		}
	}
	msg := strings.Join(lines, "\n")
	if more > 0 {
		msg += fmt.Sprintf("\n  (and %d more lines)", more)
	}
	return fmt.Errorf("%s", msg)
}

// joinBounded joins a layer's problems, all of them when they are a few,
// else as many as fit in maxLayerErrBytes and a count of the rest.
func joinBounded(errs []error) error {
	var kept []error
	total := 0
	for i, err := range errs {
		msg := err.Error()
		if len(msg) > 2*maxErrLineBytes {
			msg = msg[:2*maxErrLineBytes] + "..."
		}
		if total += len(msg); total > maxLayerErrBytes && i > 0 {
			kept = append(kept, fmt.Errorf("config: and %d more problems", len(errs)-i))
			break
		}
		kept = append(kept, errors.New(msg))
	}
	return errors.Join(kept...)
}

// readConfigFile reads a config file of at most MaxTextBytes.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxTextBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxTextBytes {
		return nil, fmt.Errorf("the file is over the limit of %d bytes (1 MiB); a config needs a few KiB", MaxTextBytes)
	}
	return b, nil
}
