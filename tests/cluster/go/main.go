//go:debug default=go1.26

// kubeairunway-apiserver serves CustomResourceDefinitions and custom resources from etcd
// with the real k8s.io/apiextensions-apiserver code that kube-apiserver embeds, for the
// project's integration tests. It runs without a core kube-apiserver:
//   - no core API informers, no admission plugins, no API priority and fairness;
//   - x509 client certificates and anonymous requests authenticate; every request is
//     authorized unless --always-allow=false (then only system:masters);
//   - root discovery (/apis) is served from the established CRDs, and /api answers with
//     an empty "v1" so that clients which probe the legacy group work.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/spf13/cobra"
	apihelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	crdv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver"
	"k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/util/openapi"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/cli"
	"k8s.io/klog/v2"
	netutils "k8s.io/utils/net"
)

func main() {
	opts := options.NewCustomResourceDefinitionsServerOptions(os.Stdout, os.Stderr)
	rec := opts.RecommendedOptions
	rec.CoreAPI = nil
	rec.Admission = nil
	rec.Features.EnablePriorityAndFairness = false
	rec.Authentication.RemoteKubeConfigFileOptional = true
	rec.Authentication.SkipInClusterLookup = true
	rec.Authorization.RemoteKubeConfigFileOptional = true
	rec.SecureServing.BindAddress = netutils.ParseIPSloppy("127.0.0.1")

	alwaysAllow := true
	cmd := &cobra.Command{
		Use:   "kubeairunway-apiserver",
		Short: "CRD-only Kubernetes API server for kubeairunway's integration tests",
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return opts.ServerRunOptions.ComponentGlobalsRegistry.Set()
		},
		RunE: func(c *cobra.Command, _ []string) error {
			if err := opts.Complete(); err != nil {
				return err
			}
			if err := opts.Validate(); err != nil {
				return err
			}
			return serve(c, opts, alwaysAllow)
		},
	}
	cmd.SetContext(genericapiserver.SetupSignalContext())
	opts.AddFlags(cmd.Flags())
	cmd.Flags().BoolVar(&alwaysAllow, "always-allow", true,
		"authorize every request; when false only system:masters is authorized")
	os.Exit(cli.Run(cmd))
}

func serve(c *cobra.Command, opts *options.CustomResourceDefinitionsServerOptions, alwaysAllow bool) error {
	rec := opts.RecommendedOptions
	if err := rec.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{netutils.ParseIPSloppy("127.0.0.1")}); err != nil {
		return fmt.Errorf("self-signed certificates: %w", err)
	}
	cfg := genericapiserver.NewRecommendedConfig(apiserver.Codecs)
	if err := opts.ServerRunOptions.ApplyTo(&cfg.Config); err != nil {
		return err
	}
	if err := rec.ApplyTo(cfg); err != nil {
		return err
	}
	if err := opts.APIEnablement.ApplyTo(&cfg.Config, apiserver.DefaultAPIResourceConfigSource(), apiserver.Scheme); err != nil {
		return err
	}
	if alwaysAllow {
		cfg.Authorization.Authorizer = authorizerfactory.NewAlwaysAllowAuthorizer()
	}
	defs := openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(generatedopenapi.GetOpenAPIDefinitions)
	namer := openapinamer.NewDefinitionNamer(apiserver.Scheme, scheme.Scheme)
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(defs, namer)
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(defs, namer)
	cfg.OpenAPIConfig.Info.Title = "kubeairunway-apiserver"
	cfg.OpenAPIV3Config.Info.Title = "kubeairunway-apiserver"

	full := (&apiserver.Config{
		GenericConfig: cfg,
		ExtraConfig: apiserver.ExtraConfig{
			CRDRESTOptionsGetter: options.NewCRDRESTOptionsGetter(*rec.Etcd, cfg.ResourceTransformers, cfg.StorageObjectCountTracker),
			ServiceResolver:      webhook.NewDefaultServiceResolver(),
			AuthResolverWrapper:  webhook.NewDefaultAuthenticationInfoResolverWrapper(nil, nil, cfg.LoopbackClientConfig, noopoteltrace.NewTracerProvider()),
		},
	}).Complete()
	// Upstream leaves root discovery to kube-apiserver's aggregator, which is absent here.
	full.GenericConfig.EnableDiscovery = true
	server, err := full.New(genericapiserver.NewEmptyDelegate())
	if err != nil {
		return err
	}

	crds := server.Informers.Apiextensions().V1().CustomResourceDefinitions()
	groups := &discoveredGroups{manager: server.GenericAPIServer.DiscoveryGroupManager, known: map[string]bool{}}
	sync := func() { groups.sync(crds.Lister().List(labels.Everything())) }
	if _, err := crds.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(interface{}) { sync() },
		UpdateFunc: func(interface{}, interface{}) { sync() },
		DeleteFunc: func(interface{}) { sync() },
	}); err != nil {
		return err
	}

	mux := server.GenericAPIServer.Handler.NonGoRestfulMux
	mux.Handle("/api", http.HandlerFunc(legacyVersions))
	mux.Handle("/api/v1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, "application/json", map[string]interface{}{
			"kind": "APIResourceList", "groupVersion": "v1", "resources": []interface{}{},
		})
	}))
	return server.GenericAPIServer.PrepareRun().RunWithContext(c.Context())
}

// discoveredGroups keeps /apis in step with the served versions of established CRDs.
type discoveredGroups struct {
	mu      sync.Mutex
	manager interface {
		AddGroup(metav1.APIGroup)
		RemoveGroup(string)
	}
	known map[string]bool
}

func (d *discoveredGroups) sync(list []*crdv1.CustomResourceDefinition, err error) {
	if err != nil {
		klog.ErrorS(err, "listing CRDs for discovery")
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	served := map[string]map[string]bool{}
	for _, crd := range list {
		if !apihelpers.IsCRDConditionTrue(crd, crdv1.Established) {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			if served[crd.Spec.Group] == nil {
				served[crd.Spec.Group] = map[string]bool{}
			}
			served[crd.Spec.Group][v.Name] = true
		}
	}
	for group, versions := range served {
		var list []metav1.GroupVersionForDiscovery
		for v := range versions {
			list = append(list, metav1.GroupVersionForDiscovery{GroupVersion: group + "/" + v, Version: v})
		}
		sort.Slice(list, func(i, j int) bool {
			return version.CompareKubeAwareVersionStrings(list[i].Version, list[j].Version) > 0
		})
		d.manager.AddGroup(metav1.APIGroup{Name: group, Versions: list, PreferredVersion: list[0]})
		d.known[group] = true
	}
	for group := range d.known {
		if served[group] == nil {
			d.manager.RemoveGroup(group)
			delete(d.known, group)
		}
	}
}

// legacyVersions answers /api: the core group is not served, but clients that probe it
// get a well-formed, empty answer in either discovery format.
func legacyVersions(w http.ResponseWriter, r *http.Request) {
	if strings.Contains(r.Header.Get("Accept"), "as=APIGroupDiscoveryList") {
		writeJSON(w, "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList", map[string]interface{}{
			"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
			"metadata": map[string]interface{}{}, "items": []interface{}{},
		})
		return
	}
	writeJSON(w, "application/json", map[string]interface{}{
		"kind": "APIVersions", "versions": []string{"v1"},
		"serverAddressByClientCIDRs": []map[string]string{{"clientCIDR": "0.0.0.0/0", "serverAddress": r.Host}},
	})
}

func writeJSON(w http.ResponseWriter, contentType string, v interface{}) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	_, _ = w.Write(body)
}
